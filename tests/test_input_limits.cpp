// Hardening round 2 (engine/core/input_limits.h): nesting limits on every JSON, files read only when regular and within
// a size limit, and the GUI's settings validated key by key. Each refusal is one line naming the file, and comes at
// once whatever the input's size (a 50 MB nest of arrays is refused at its 65th level).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/input_limits.h"
#include "engine/session/session.h"
#include "engine/session/session_scan.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

std::string nest(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(InputLimits, DeepJsonIsRefusedAtOnce) {
  EXPECT_NO_THROW(ds::parse_json(nest(64), "x"));
  // 50 MB of nesting: the parser stops at the 65th level (building the nest took minutes and gigabytes; the speed is
  // not asserted here, the refusal and its message are).
  const std::string deep = nest(25'000'000);
  const std::string msg = dstest::error_of([&] { ds::parse_json(deep, "deep.json"); });
  EXPECT_NE(msg.find("deep.json: JSON nested deeper than 64 levels"), std::string::npos) << msg;
  EXPECT_THROW(ds::parse_json("{\"a\": [1, 2", "x"), nlohmann::json::parse_error);
}

TEST(InputLimits, DeepConfigAndHeaderAreOneLineErrors) {
  dstest::TempDir t;
  const fs::path src = dstest::fixture("diff_n1");
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(src / f, t.path / f);
  nlohmann::json c = nlohmann::json::parse(dstest::read_file(t.str() + "/config.json"));
  std::string text = c.dump();
  text.insert(text.size() - 1, ", \"extra\": " + nest(100000));
  dstest::write_file(t.str() + "/config.json", text);
  const std::string msg = dstest::error_of([&] { ds::Session::open(t.str(), ds::BackendChoice::Cpu, nullptr, 1); });
  EXPECT_NE(msg.find("config.json: JSON nested deeper than"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

// A safetensors header that is one deep nest (it took 24 s and 4 GB before): refused at its 65th level.
TEST(InputLimits, DeepSafetensorsHeaderIsRefusedAtOnce) {
  dstest::TempDir t;
  dstest::write_file(t.str() + "/config.json", dstest::read_file(dstest::fixture("diff_n1") + "/config.json"));
  const std::string header = nest(5'000'000);
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[size_t(i)] = char((uint64_t(header.size()) >> (8 * i)) & 0xff);
  dstest::write_file(t.str() + "/model.safetensors", file + header);
  const std::string msg = dstest::error_of([&] { ds::Session::open(t.str(), ds::BackendChoice::Cpu, nullptr, 1); });
  EXPECT_NE(msg.find("model.safetensors: header: JSON nested deeper than 64 levels"), std::string::npos) << msg;
}

TEST(InputLimits, NonRegularFilesAreRefusedByName) {
  dstest::TempDir t;
  const std::string dir = t.str() + "/a_directory";
  fs::create_directory(dir);
  std::string msg = dstest::error_of([&] { ds::read_text_file(dir, 1000, "prompt file"); });
  EXPECT_NE(msg.find(dir + ": is a directory, not a prompt file"), std::string::npos) << msg;
  const std::string fifo = t.str() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  msg = dstest::error_of([&] { ds::read_text_file(fifo, 1000, "prompt file"); });  // must not block on the FIFO
  EXPECT_NE(msg.find(fifo + ": is not a regular file"), std::string::npos) << msg;
  msg = dstest::error_of([&] { ds::read_text_file("/dev/zero", 1000, "prompt file"); });
  EXPECT_NE(msg.find("/dev/zero: is not a regular file"), std::string::npos) << msg;
  msg = dstest::error_of([&] { ds::read_text_file(t.str() + "/missing", 1000, "prompt file"); });
  EXPECT_NE(msg.find("missing: cannot open the prompt file"), std::string::npos) << msg;
  const std::string big = t.str() + "/big.txt";
  dstest::write_file(big, std::string(5000, 'x'));
  msg = dstest::error_of([&] { ds::read_text_file(big, 1000, "prompt file"); });
  EXPECT_NE(msg.find("big.txt: the prompt file is 4.9 KB, more than the 1000 bytes"), std::string::npos) << msg;
  EXPECT_EQ(ds::read_text_file(big, 5000, "prompt file").size(), 5000u);
}

TEST(InputLimits, DeepCorpusLineIsSkippedWithItsReason) {
  EXPECT_THROW(ds::scan::parse_line("{\"text\": \"a\", \"answer\": [0, 1], \"tag\": " + nest(100000) + "}", 1), ds::Error);
  try {
    ds::scan::parse_line("{\"text\": \"a\", \"answer\": [0, 1], \"tag\": " + nest(100000) + "}", 1);
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nested deeper"), std::string::npos) << e.what();
  }
}

TEST(InputLimits, CorpusFilesAreBounded) {
  dstest::TempDir t;
  std::string msg = dstest::error_of([&] { ds::scan::read_corpus(t.str()); });
  EXPECT_NE(msg.find("is a directory, not a corpus"), std::string::npos) << msg;
  const std::string good = "{\"ids\": [0, 5, 6, 7], \"answer\": [1, 3]}";
  const std::string p = t.str() + "/c.jsonl";
  dstest::write_file(p, good + "\n{\"text\": \"" + std::string(ds::scan::kMaxCorpusLineBytes + 10, 'a') + "\"}\n" + good + "\n");
  const ds::scan::Corpus c = ds::scan::read_corpus(p);
  EXPECT_EQ(c.prompts.size(), 2u);  // the lines on either side of the long one are read
  ASSERT_EQ(c.errors.size(), 1u);
  EXPECT_EQ(c.errors[0].line, 2);
  EXPECT_NE(c.errors[0].error.find("longer than"), std::string::npos) << c.errors[0].error;
}

}  // namespace
