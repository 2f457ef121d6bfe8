// The line between the daemon and the model families: the daemon decides a
// model's family once, at load, through the chat dialect registry, and
// otherwise holds no family's name. These checks read the daemon's sources
// (comments and string literals aside: prose may name a family, code may
// not) and compare the dialect registry with the engine's family registry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "moeserve/chat/dialect.hpp"
#include "moeserve/engine/family_registry.hpp"

namespace moeserve::chat {
namespace {

namespace fs = std::filesystem;

fs::path SourceDir() {
  const char* dir = std::getenv("MOESERVE_SOURCE_DIR");
  return dir ? dir : MOESERVE_SOURCE_DIR_DEFAULT;
}

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The code of a C++ file: comments removed, string and character literals
// emptied, #include lines kept whole (their paths are what they say).
std::string CodeOnly(const std::string& text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text.compare(i, 8, "#include") == 0) {
      const size_t end = text.find('\n', i);
      out += text.substr(i, end == std::string::npos ? std::string::npos : end - i);
      i = end == std::string::npos ? text.size() : end;
    } else if (text.compare(i, 2, "//") == 0) {
      i = text.find('\n', i);
      if (i == std::string::npos) break;
    } else if (text.compare(i, 2, "/*") == 0) {
      const size_t end = text.find("*/", i + 2);
      i = end == std::string::npos ? text.size() : end + 2;
    } else if (text.compare(i, 2, "R\"") == 0) {
      const size_t open = text.find('(', i);
      const std::string close = ")" + text.substr(i + 2, open - i - 2) + "\"";
      const size_t end = text.find(close, open);
      out += "\"\"";
      i = end == std::string::npos ? text.size() : end + close.size();
    } else if (text[i] == '"' || text[i] == '\'') {
      const char quote = text[i++];
      while (i < text.size() && text[i] != quote) i += text[i] == '\\' ? 2 : 1;
      ++i;
      out += quote;
      out += quote;
    } else {
      out += text[i++];
    }
  }
  return out;
}

std::vector<fs::path> DaemonSources() {
  std::vector<fs::path> files;
  for (const fs::path root : {SourceDir() / "daemon", SourceDir() / "include/moeserve/daemon"}) {
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".cpp" || ext == ".hpp")) files.push_back(e.path());
    }
  }
  return files;
}

// The code of every daemon source names no family: no identifier of one, no
// family-specific header, no down-cast of the engine's chat hooks.
TEST(FamilyBoundary, DaemonCodeNamesNoFamily) {
  const std::regex family_word(R"((harmony|qwen|deepseek|gpt_?oss|moe_?dsa|dsml|chatml))", std::regex::icase);
  const std::regex family_header(
      R"(#include\s+"moeserve/(chat/(moe_dsa_v1|gpt_oss|qwen3_next|deepseek_v32)/|engine/(gpt_oss_model|qwen3_chat|deepseek_chat|harmony|families/)))");
  const std::regex down_cast(R"((dynamic_cast|static_cast<\s*const\s+engine::\w*(Hooks|Chat)))");
  const std::vector<fs::path> files = DaemonSources();
  ASSERT_GT(files.size(), 50u) << "the daemon's sources were not found under " << SourceDir();
  for (const fs::path& file : files) {
    const std::string code = CodeOnly(Read(file));
    std::smatch m;
    EXPECT_FALSE(std::regex_search(code, m, family_header)) << file << " includes a family's header: " << m.str();
    std::string no_includes = std::regex_replace(code, std::regex(R"(#include[^\n]*)"), "");
    EXPECT_FALSE(std::regex_search(no_includes, m, family_word)) << file << " names a family in code: " << m.str();
    EXPECT_FALSE(std::regex_search(no_includes, m, down_cast)) << file << " down-casts: " << m.str();
  }
}

// The check above can fail: it finds a family's name in code, and not in a comment.
TEST(FamilyBoundary, CodeOnlyKeepsCodeAndDropsProse) {
  const std::string code = CodeOnly("int harmony_ = 1; // qwen3 here\n/* deepseek */ auto s = \"gpt-oss\";\n"
                                    "#include \"moeserve/chat/gpt_oss/harmony_request.hpp\"\n");
  EXPECT_NE(code.find("harmony_"), std::string::npos);
  EXPECT_EQ(code.find("qwen3"), std::string::npos);
  EXPECT_EQ(code.find("deepseek"), std::string::npos);
  EXPECT_EQ(code.find("gpt-oss"), std::string::npos);
  EXPECT_NE(code.find("moeserve/chat/gpt_oss/harmony_request.hpp"), std::string::npos);
}

// Every family the engine loads has a chat dialect, and no dialect names a
// family the engine does not have.
TEST(FamilyBoundary, EveryEngineFamilyHasADialect) {
  std::vector<std::string> engine_families;
  for (const engine::FamilyEntry& f : engine::Families()) engine_families.emplace_back(f.name);
  std::vector<std::string> dialects = DialectFamilies();
  std::sort(engine_families.begin(), engine_families.end());
  std::sort(dialects.begin(), dialects.end());
  EXPECT_EQ(dialects, engine_families);
  auto unknown = LoadDialect("no-such-family", DialectInputs{});
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message().find("no chat format for no-such-family"), std::string::npos)
      << unknown.error().message();
}

// The recipe docs/architecture.md gives for a family's chat: its folder under
// chat/ and its line in chat/dialect_registry.cpp (with the include of its
// header). Each registered family has exactly that.
TEST(FamilyBoundary, AFamilysChatIsItsFolderAndItsRegistryLine) {
  const std::string registry = Read(SourceDir() / "chat/dialect_registry.cpp");
  const std::string docs = Read(SourceDir() / "docs/architecture.md");
  EXPECT_NE(docs.find("| [chat dialect](#add-a-familys-chat) |"), std::string::npos)
      << "docs/architecture.md's recipes table has no chat dialect row";
  for (const std::string& family : DialectFamilies()) {
    std::string folder = family;
    std::replace(folder.begin(), folder.end(), '-', '_');
    EXPECT_TRUE(fs::is_directory(SourceDir() / "chat" / folder)) << "no chat/" << folder << "/";
    EXPECT_TRUE(fs::is_directory(SourceDir() / "include/moeserve/chat" / folder));
    const std::string include = "#include \"moeserve/chat/" + folder + "/";
    size_t includes = 0;
    for (size_t at = registry.find(include); at != std::string::npos; at = registry.find(include, at + 1)) ++includes;
    EXPECT_EQ(includes, 1u) << family;
    EXPECT_NE(registry.find("{\"" + family + "\", "), std::string::npos) << family << " has no registry line";
  }
}

}  // namespace
}  // namespace moeserve::chat
