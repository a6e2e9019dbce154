// What the tools read from files, bounded before it is used: every JSON (config.json, generation_config.json,
// tokenizer.json, a shard index, a safetensors header, corpus lines, the GUI's settings) is parsed with its nesting
// limited, so that no input drives a copy or destruction thousands of levels deep; every text file a user points at
// is checked to be a regular file and read only up to a size limit, so that a directory, a FIFO, /dev/zero or a
// multi-gigabyte file is refused at once with its name instead of hanging or exhausting memory.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ds {

constexpr int kJsonMaxDepth = 64;  // Hugging Face configs and tokenizers nest fewer than 10 levels

// Parses text. Malformed text throws nlohmann::json::parse_error (callers turn it into their one-line message);
// nesting deeper than max_depth throws ds::Error "WHAT: JSON nested deeper than N levels" (or without "WHAT: ").
nlohmann::json parse_json(std::string_view text, const std::string& what, int max_depth = kJsonMaxDepth);

// The whole of a regular file of at most max_bytes. Throws ds::Error naming the file: missing or unreadable, a
// directory, not a regular file (FIFO, device, socket), or larger than the limit (`what` says what the file was
// for, e.g. "prompt file"). Reads at most max_bytes + 1 bytes whatever the file claims or becomes.
std::string read_text_file(const std::string& path, uint64_t max_bytes, const std::string& what);

// A prompt file (the CLI's and the GUI's --prompt-file, File > Open prompt): read_text_file with a 64 MB limit (far
// more text than any model's positions take; Session::set_prompt refuses what cannot fit before tokenizing), one
// trailing line end (\n or \r\n) dropped, as editors add it. A token-ids file: the same limit, read as it is.
constexpr uint64_t kMaxPromptFileBytes = uint64_t(64) << 20;
std::string read_prompt_file(const std::string& path);
std::string read_token_ids_file(const std::string& path);

// Checks that path names a regular file that can be opened (the same messages), without reading it.
void check_regular_file(const std::string& path, const std::string& what);

// Memory a new allocation can take without swapping (MemAvailable), and free space on the file system holding path
// (its folder when path does not exist yet); 0 when unknown. For size checks of outputs before work starts.
uint64_t available_memory_bytes();
uint64_t free_disk_bytes(const std::string& path);

// "12.5 MB" style sizes for the messages.
std::string format_bytes(uint64_t bytes);

}  // namespace ds
