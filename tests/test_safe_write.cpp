// engine/core/safe_write.h: every file the tools write goes through one writer that never loses a file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "engine/core/error.h"
#include "engine/core/safe_write.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

size_t files_in(const fs::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

TEST(SafeWrite, ReplacesAtomicallyAndKeepsTheMode) {
  dstest::TempDir t;
  const std::string p = t.str() + "/report.json";
  dstest::write_file(p, "old");
  ASSERT_EQ(::chmod(p.c_str(), 0640), 0);
  ds::write_file_safely(p, "new", "the report");
  EXPECT_EQ(dstest::read_file(p), "new");
  struct stat st {};
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(files_in(t.path), 1u) << "a temporary was left behind";
  {
    ds::SafeWriter w(p, "the report");
    w.write("half of a new one");
    // no commit: as an error or an interruption would leave it
  }
  EXPECT_EQ(dstest::read_file(p), "new");
  EXPECT_EQ(files_in(t.path), 1u);
}

TEST(SafeWrite, ASymlinkKeepsPointingAtItsUpdatedTarget) {
  dstest::TempDir t;
  const std::string target = t.str() + "/real.csv", link = t.str() + "/link.csv";
  dstest::write_file(target, "old");
  fs::create_symlink("real.csv", link);
  ds::write_file_safely(link, "new", "the CSV");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(dstest::read_file(target), "new");
}

TEST(SafeWrite, RefusesWhatIsNotARegularFileOrIsAnInput) {
  dstest::TempDir t;
  const std::string fifo = t.str() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(dstest::error_of([&] { ds::write_file_safely(fifo, "x", "the report"); }).find("fifo: is not a regular file"),
            std::string::npos);
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_NE(dstest::error_of([&] { ds::write_file_safely(t.str(), "x", "the report"); }).find("is a directory"), std::string::npos);
  const std::string in = t.str() + "/corpus.jsonl";
  dstest::write_file(in, "{\"text\": \"keep me\"}\n");
  fs::create_symlink("corpus.jsonl", t.str() + "/alias.jsonl");
  for (const std::string& out : {in, t.str() + "/./corpus.jsonl", t.str() + "/alias.jsonl"}) {
    const std::string msg = dstest::error_of([&] { ds::write_file_safely(out, "x", "the report", {in}); });
    EXPECT_NE(msg.find("is the input"), std::string::npos) << out << ": " << msg;
  }
  EXPECT_EQ(dstest::read_file(in), "{\"text\": \"keep me\"}\n");
  EXPECT_NE(dstest::error_of([&] { ds::write_file_safely(t.str() + "/no/such/dir/x.json", "x", "the report"); })
                .find("does not exist"),
            std::string::npos);
}

TEST(SafeWrite, TwoWritersOfOneTargetDoNotShareATemporary) {
  dstest::TempDir t;
  const std::string p = t.str() + "/out.json";
  ds::SafeWriter a(p, "the report"), b(p, "the report");
  a.write("first");
  b.write("second");
  b.commit();
  a.commit();
  EXPECT_EQ(dstest::read_file(p), "first");
  EXPECT_EQ(files_in(t.path), 1u);
}

}  // namespace
