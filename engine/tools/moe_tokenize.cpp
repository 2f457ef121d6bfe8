// moe-tokenize: a Hugging Face tokenizer.json applied to a file.
//
//   moe-tokenize --tokenizer PATH/tokenizer.json FILE... [--added-tokens MODE] [--time]
//       prints the ids of each FILE (UTF-8 text) as one comma-separated line
//       (one line per file, the tokenizer loaded once). No
//       special tokens are added. MODE says how text spelling an added token
//       reads: special-as-text (default: a special token's text is plain
//       text, as for user input; non-special added tokens still match, as in
//       Hugging Face's split_special_tokens), match (every added token's text
//       is its id) or all-as-text.
//   moe-tokenize --tokenizer PATH/tokenizer.json --decode FILE [--skip-special]
//       reads comma-separated ids from FILE and prints their text.
//
// --time prints the load and encode times and the encode throughput to stderr.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "moeserve/engine/hf_tokenizer.hpp"

using namespace moeserve;
using namespace moeserve::engine;

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: moe-tokenize --tokenizer TOKENIZER.json FILE... [--added-tokens special-as-text|match|all-as-text] "
               "[--time]\n"
               "       moe-tokenize --tokenizer TOKENIZER.json --decode FILE [--skip-special]\n");
  return 2;
}

bool ReadFile(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return !in.bad();
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Prints the text of the comma-separated ids in input.
bool DecodeFile(const HfTokenizer& tokenizer, const std::string& file, std::string_view input, bool skip_special) {
  std::vector<int> ids;
  std::string_view rest = input;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string item(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    size_t used = 0;
    int id = -1;
    try {
      id = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && std::isspace(static_cast<unsigned char>(item[used]))) ++used;
    if (used == 0 || used != item.size() || id < 0) {
      std::fprintf(stderr, "moe-tokenize: %s: '%s' is not a token id\n", file.c_str(), item.c_str());
      return false;
    }
    ids.push_back(id);
  }
  std::string text = tokenizer.Decode(ids, skip_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return true;
}

// Prints the ids of input as one comma-separated line.
bool EncodeFile(const HfTokenizer& tokenizer, const std::string& file, std::string_view input, AddedTokenText mode,
                bool timing) {
  auto start = std::chrono::steady_clock::now();
  auto ids = tokenizer.Encode(input, mode);
  const double encode_s = Seconds(start);
  if (!ids) {
    std::fprintf(stderr, "moe-tokenize: %s: %s\n", file.c_str(), ids.error().ToString().c_str());
    return false;
  }
  std::string line;
  line.reserve(ids->size() * 7);
  for (size_t i = 0; i < ids->size(); ++i) {
    if (i) line += ',';
    line += std::to_string((*ids)[i]);
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stdout);
  if (timing) {
    std::fprintf(stderr, "%s: encode %.3f s, %zu bytes -> %zu ids, %.2f MB/s\n", file.c_str(), encode_s, input.size(),
                 ids->size(), encode_s > 0 ? input.size() / encode_s / 1e6 : 0.0);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, mode_name = "special-as-text";
  std::vector<std::string> files;
  bool decode = false, skip_special = false, timing = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) tokenizer_path = argv[++i];
    else if (a == "--added-tokens" && i + 1 < argc) mode_name = argv[++i];
    else if (a == "--decode") decode = true;
    else if (a == "--skip-special") skip_special = true;
    else if (a == "--time") timing = true;
    else if (!a.empty() && a[0] != '-') files.push_back(a);
    else return Usage();
  }
  if (tokenizer_path.empty() || files.empty() || (decode && files.size() != 1)) return Usage();
  AddedTokenText mode;
  if (mode_name == "special-as-text") mode = AddedTokenText::kSpecialAsText;
  else if (mode_name == "match") mode = AddedTokenText::kMatchAll;
  else if (mode_name == "all-as-text") mode = AddedTokenText::kAllAsText;
  else return Usage();

  const auto start = std::chrono::steady_clock::now();
  auto tokenizer = HfTokenizer::FromFile(tokenizer_path);
  if (!tokenizer) {
    std::fprintf(stderr, "moe-tokenize: %s\n", tokenizer.error().ToString().c_str());
    return 1;
  }
  const double load_s = Seconds(start);
  if (timing) std::fprintf(stderr, "load %.3f s\n", load_s);

  for (const std::string& file : files) {
    std::string input;
    if (!ReadFile(file, input)) {
      std::fprintf(stderr, "moe-tokenize: %s: cannot read\n", file.c_str());
      return 1;
    }
    if (!(decode ? DecodeFile(*tokenizer, file, input, skip_special) : EncodeFile(*tokenizer, file, input, mode, timing)))
      return 1;
  }
  return 0;
}
