// daemon.session_images: image parts in session turns and in the Responses
// API's chains, kept once per tenant by content hash and replayed.
//
// A session turn with a PNG is answered and its image counted; a later
// text-only turn replays it (its span counted again, and the prefix cache
// serves the earlier prompt, image blocks included); the same picture sent
// again is stored once. Another tenant can never name a kept image (its
// stored-image URL is refused, in a session turn and on the stateless
// endpoint) and keeps its own copy of the same picture. A session past
// session_image_max_bytes is refused naming it; image_max_per_request is
// per turn. Deleting the session (or its expiry) deletes its files. A killed daemon, started
// again, replays the image of an acknowledged turn. Responses chained with
// previous_response_id replay their input_image the same way.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "daemon_harness.hpp"
#include "daemon_process.hpp"
#include "image_serving.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::daemon::testing {
namespace {

std::string Png(uint32_t w, uint32_t h, uint8_t tint = 0) {
  auto rgb = test_support::Gradient(w, h);
  rgb[0] = static_cast<uint8_t>(rgb[0] ^ tint);  // another picture of the same size
  return test_support::EncodePng(w, h, rgb);
}
int64_t Span(uint32_t w, uint32_t h) { return *engine::ImageSpanTokens(engine::TinyVisionConfig(), w, h); }

std::string HashOf(const std::string& png) {
  auto decoded = DecodeImage(png, ImageLimits{}, 0);
  EXPECT_TRUE(decoded.has_value());
  return engine::ImageContentHash(decoded->width, decoded->height, decoded->rgb);
}

// Rows of the images table per tenant, read from the database file beside the daemon.
std::map<std::string, int64_t> ImageRows(const std::string& db_path) {
  std::map<std::string, int64_t> out;
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, "SELECT tenant, count(*) FROM images GROUP BY tenant", -1, &s, nullptr), SQLITE_OK);
  while (s && sqlite3_step(s) == SQLITE_ROW)
    out[reinterpret_cast<const char*>(sqlite3_column_text(s, 0))] = sqlite3_column_int64(s, 1);
  sqlite3_finalize(s);
  sqlite3_close(db);
  return out;
}

const std::map<std::string, std::string> kAlice = {{"Authorization", "Bearer sk-alice-0123456789"}};
const std::map<std::string, std::string> kBob = {{"Authorization", "Bearer sk-bob-0123456789ab"}};

struct Served {
  std::unique_ptr<Daemon> daemon;
  int port = 0;
  std::string db;
};

Served Serve(const std::string& name, const std::function<void(DaemonConfig&)>& adjust = {}) {
  DaemonConfig c = TestConfig();
  c.model = VisionModelDir();
  c.state_dir = ::testing::TempDir() + "/moe_session_images_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(c.state_dir);
  std::filesystem::create_directories(c.state_dir);
  c.api_keys_file = c.state_dir + "/keys.yaml";
  std::ofstream(c.api_keys_file) << "keys:\n  - {key: sk-alice-0123456789, tenant: alice}\n"
                                    "  - {key: sk-bob-0123456789ab, tenant: bob}\n";
  if (adjust) adjust(c);
  Served s;
  s.db = c.state_dir + "/sessions.sqlite3";
  s.daemon = StartDaemon(c);
  if (s.daemon) s.port = PortOf(*s.daemon);
  return s;
}

std::string NewSession(int port, const std::map<std::string, std::string>& key) {
  auto r = Http(port, "POST", "/v1/sessions", json{{"system", "terse"}}.dump(), key);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.Json().value("id", "");
}

HttpResponse Turn(int port, const std::string& id, const json& messages, const std::map<std::string, std::string>& key) {
  return Http(port, "POST", "/v1/sessions/" + id + "/chat/completions",
              json{{"messages", messages}, {"max_tokens", 4}, {"seed", 1}}.dump(), key);
}

TEST(SessionImages, KeptOnceReplayedIsolatedAndDeleted) {
  auto s = Serve("kept");
  ASSERT_TRUE(s.daemon);
  const std::string picture = NoisyPng(64, 48, 1);
  const int64_t span = Span(64, 48);
  const std::string id = NewSession(s.port, kAlice);

  auto first = Turn(s.port, id, ImageChatMessages({PngDataUrl(picture)}), kAlice);
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(first.Json()["usage"]["prompt_tokens_details"]["image_tokens"], span) << first.body;
  const int64_t first_prompt = first.Json()["usage"]["prompt_tokens"];
  const int64_t bytes_after_first = Http(s.port, "GET", "/v1/sessions/" + id, "", kAlice).Json()["bytes"];

  // A text-only turn: the kept image is in the prompt again, and the prompt
  // of the first turn (its image blocks included) comes from the prefix cache.
  auto second = Turn(s.port, id, UserTurn("And the colours?"), kAlice);
  ASSERT_EQ(second.status, 200) << second.body;
  const json usage = second.Json()["usage"];
  EXPECT_EQ(usage["prompt_tokens_details"]["image_tokens"], span) << usage.dump();
  EXPECT_GT(usage["prompt_tokens"].get<int64_t>(), first_prompt);
  EXPECT_GE(usage["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), first_prompt - 16) << usage.dump();

  // The entry names its image by hash.
  const json session = Http(s.port, "GET", "/v1/sessions/" + id, "", kAlice).Json();
  const std::string hash = HashOf(picture);
  ASSERT_TRUE(session["entries"][1].contains("images")) << session.dump();
  EXPECT_EQ(session["entries"][1]["images"][0]["sha256"], hash);
  EXPECT_EQ(session["entries"][1]["images"][0]["tokens"], span);

  // The same picture again: one file, the session grows by the reference only.
  const int64_t bytes_before_third = Http(s.port, "GET", "/v1/sessions/" + id, "", kAlice).Json()["bytes"];
  auto third = Turn(s.port, id, ImageChatMessages({PngDataUrl(picture)}, "Same one?"), kAlice);
  ASSERT_EQ(third.status, 200) << third.body;
  EXPECT_EQ(third.Json()["usage"]["prompt_tokens_details"]["image_tokens"], 2 * span);
  const int64_t bytes_after_third = Http(s.port, "GET", "/v1/sessions/" + id, "", kAlice).Json()["bytes"];
  EXPECT_LT(bytes_after_third - bytes_before_third, static_cast<int64_t>(picture.size()));
  EXPECT_GE(bytes_after_first, static_cast<int64_t>(picture.size()));
  EXPECT_EQ(ImageRows(s.db), (std::map<std::string, int64_t>{{"alice", 1}}));

  // Another tenant cannot name it: not in a session turn, not on the stateless endpoint.
  const std::string bobs = NewSession(s.port, kBob);
  const std::string named = "moe-stored-image:sha256:" + hash;
  auto stolen = Turn(s.port, bobs, ImageChatMessages({named}), kBob);
  EXPECT_EQ(stolen.status, 400) << stolen.body;
  EXPECT_EQ(stolen.Json()["error"]["param"], "messages[0].content[1].image_url.url") << stolen.body;
  EXPECT_NE(stolen.body.find("must be a data: URL or an http(s) URL"), std::string::npos) << stolen.body;
  auto stateless = Chat(s.port, json{{"model", "tiny"}, {"messages", ImageChatMessages({named})}, {"max_tokens", 4}}, kBob);
  EXPECT_EQ(stateless.status, 400) << stateless.body;
  // Nor the owner, outside the session that keeps it.
  auto own = Chat(s.port, json{{"model", "tiny"}, {"messages", ImageChatMessages({named})}, {"max_tokens", 4}}, kAlice);
  EXPECT_EQ(own.status, 400) << own.body;
  // The same picture sent by the other tenant is its own copy.
  auto bobs_turn = Turn(s.port, bobs, ImageChatMessages({PngDataUrl(picture)}), kBob);
  ASSERT_EQ(bobs_turn.status, 200) << bobs_turn.body;
  EXPECT_EQ(ImageRows(s.db), (std::map<std::string, int64_t>{{"alice", 1}, {"bob", 1}}));

  // Deleting the session deletes the files no conversation names any more.
  ASSERT_EQ(Http(s.port, "DELETE", "/v1/sessions/" + id, "", kAlice).status, 200);
  EXPECT_EQ(ImageRows(s.db), (std::map<std::string, int64_t>{{"bob", 1}}));
  auto bobs_next = Turn(s.port, bobs, UserTurn("Still there?"), kBob);
  ASSERT_EQ(bobs_next.status, 200) << bobs_next.body;
  EXPECT_EQ(bobs_next.Json()["usage"]["prompt_tokens_details"]["image_tokens"], span);
  s.daemon->Shutdown(1);
}

TEST(SessionImages, LimitsApplyPerTurnAndPerSession) {
  const std::string a = Png(40, 24, 1), b = Png(40, 24, 2), c = Png(40, 24, 3);
  auto s = Serve("limits", [&](DaemonConfig& cfg) {
    cfg.images.max_per_request = 2;
    // Room for the first two pictures, not for the third.
    cfg.sessions.image_max_bytes = static_cast<int64_t>(a.size() + b.size() + c.size()) - 1;
  });
  ASSERT_TRUE(s.daemon);
  const std::string id = NewSession(s.port, kAlice);
  auto over = Turn(s.port, id, ImageChatMessages({PngDataUrl(a), PngDataUrl(b), PngDataUrl(c)}), kAlice);
  EXPECT_EQ(over.status, 400) << over.body;
  EXPECT_NE(over.body.find("(image_max_per_request"), std::string::npos) << over.body;
  EXPECT_EQ(over.Json()["error"]["param"], "messages[0].content[3].image_url.url");
  auto two = Turn(s.port, id, ImageChatMessages({PngDataUrl(a), PngDataUrl(b)}), kAlice);
  ASSERT_EQ(two.status, 200) << two.body;
  // Kept images do not count against the per-request limit: two kept plus one new.
  auto again = Turn(s.port, id, ImageChatMessages({PngDataUrl(a)}, "The first again"), kAlice);
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.Json()["usage"]["prompt_tokens_details"]["image_tokens"], 3 * Span(40, 24));
  auto third = Turn(s.port, id, ImageChatMessages({PngDataUrl(c)}), kAlice);
  EXPECT_EQ(third.status, 400) << third.body;
  EXPECT_NE(third.body.find("(session_image_max_bytes)"), std::string::npos) << third.body;
  EXPECT_EQ(ImageRows(s.db), (std::map<std::string, int64_t>{{"alice", 2}}));
  s.daemon->Shutdown(1);
}

TEST(SessionImages, ExpiredSessionsTakeTheirImagesWithThem) {
  auto s = Serve("expiry", [](DaemonConfig& cfg) { cfg.sessions.idle_seconds = 1; });
  ASSERT_TRUE(s.daemon);
  const std::string id = NewSession(s.port, kAlice);
  auto turn = Turn(s.port, id, ImageChatMessages({PngDataUrl(Png(40, 24, 4))}), kAlice);
  ASSERT_EQ(turn.status, 200) << turn.body;
  ASSERT_EQ(ImageRows(s.db), (std::map<std::string, int64_t>{{"alice", 1}}));
  // The sweeper deletes the idle session (every quarter of the idle time); its file goes with it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!ImageRows(s.db).empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(ImageRows(s.db).empty());
  EXPECT_EQ(Http(s.port, "GET", "/v1/sessions/" + id, "", kAlice).status, 404);
  s.daemon->Shutdown(1);
}

TEST(SessionImages, ResponsesChainsReplayTheirImages) {
  auto s = Serve("responses");
  ASSERT_TRUE(s.daemon);
  const std::string picture = Png(48, 32, 5);
  const int64_t span = Span(48, 32);
  json input = json::array({{{"role", "user"},
                             {"content", json::array({{{"type", "input_text"}, {"text", "Read this"}},
                                                      {{"type", "input_image"},
                                                       {"image_url", PngDataUrl(picture)},
                                                       {"detail", "auto"}}})}}});
  auto first = Http(s.port, "POST", "/v1/responses",
                    json{{"model", "tiny"}, {"input", input}, {"max_output_tokens", 4}}.dump(), kAlice);
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(first.Json()["usage"]["input_tokens_details"]["image_tokens"], span) << first.body;
  const std::string first_id = first.Json()["id"];
  auto second = Http(s.port, "POST", "/v1/responses",
                     json{{"model", "tiny"}, {"input", "And now?"}, {"previous_response_id", first_id},
                          {"max_output_tokens", 4}}
                         .dump(),
                     kAlice);
  ASSERT_EQ(second.status, 200) << second.body;
  EXPECT_EQ(second.Json()["usage"]["input_tokens_details"]["image_tokens"], span) << second.body;
  EXPECT_EQ(ImageRows(s.db), (std::map<std::string, int64_t>{{"alice", 1}}));
  // Bad parts are named as the client sent them.
  input[0]["content"][1]["image_url"] = "data:image/png;base64,!!!!";
  auto bad = Http(s.port, "POST", "/v1/responses", json{{"model", "tiny"}, {"input", input}}.dump(), kAlice);
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(bad.Json()["error"]["param"], "input[0].content[1].image_url") << bad.body;
  // The chain's file stays while a response names it, and goes with the last.
  ASSERT_EQ(Http(s.port, "DELETE", "/v1/responses/" + first_id, "", kAlice).status, 200);
  EXPECT_EQ(ImageRows(s.db), (std::map<std::string, int64_t>{{"alice", 1}}));
  const std::string second_id = second.Json()["id"];
  auto third = Http(s.port, "POST", "/v1/responses",
                    json{{"model", "tiny"}, {"input", "Once more"}, {"previous_response_id", second_id},
                         {"max_output_tokens", 4}, {"store", false}}
                        .dump(),
                    kAlice);
  ASSERT_EQ(third.status, 200) << third.body;
  EXPECT_EQ(third.Json()["usage"]["input_tokens_details"]["image_tokens"], span) << third.body;
  ASSERT_EQ(Http(s.port, "DELETE", "/v1/responses/" + second_id, "", kAlice).status, 200);
  EXPECT_TRUE(ImageRows(s.db).empty());
  s.daemon->Shutdown(1);
}

TEST(SessionImages, AKilledDaemonReplaysAcknowledgedImages) {
  const std::string state = ::testing::TempDir() + "/moe_session_images_crash_" + std::to_string(::getpid());
  std::filesystem::remove_all(state);
  std::filesystem::create_directories(state);
  const std::vector<std::string> flags = {"--model", VisionModelDir(), "--state-dir", state};
  const std::string picture = Png(40, 24, 9);
  std::string id;
  {
    DaemonProcess d(flags);
    ASSERT_TRUE(d.WaitReady()) << "moe-daemon did not become ready";
    auto created = Http(d.port(), "POST", "/v1/sessions", json{{"system", "terse"}}.dump());
    ASSERT_EQ(created.status, 200) << created.body;
    id = created.Json()["id"];
    auto turn = Turn(d.port(), id, ImageChatMessages({PngDataUrl(picture)}), {});
    ASSERT_EQ(turn.status, 200) << turn.body;
    d.Kill();  // SIGKILL right after the acknowledged turn
  }
  DaemonProcess again(flags);
  ASSERT_TRUE(again.WaitReady()) << "moe-daemon did not start again on the same state directory";
  auto next = Turn(again.port(), id, UserTurn("What was in it?"), {});
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(next.Json()["usage"]["prompt_tokens_details"]["image_tokens"], Span(40, 24)) << next.body;
  std::filesystem::remove_all(state);
}

}  // namespace
}  // namespace moeserve::daemon::testing
