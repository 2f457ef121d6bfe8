// daemon.responses_image_quota: the image files stored responses keep count
// against their tenant's quota (session_tenant_quota_bytes) and the global
// cap (session_total_quota_bytes) for as long as any response names them.
//
// The attack: create a response with a large image, continue it (the
// continuation names the same file), delete the first. The continuation
// keeps the file alive; were only the images a request sends new counted,
// every round would leave one more file counted by nobody. Here each round's
// file stays counted, so the tenant's third file is refused (403
// response_quota_exceeded) and the database file on the state volume never
// holds more image bytes than the quota allows; a second tenant then meets
// the global cap (507 response_storage_full), and so does a session turn,
// whose global check counts the responses' files too.
#include <gtest/gtest.h>

#include <fstream>

#include "daemon_harness.hpp"
#include "image_serving.hpp"

namespace moeserve::daemon::testing {
namespace {

const std::map<std::string, std::string> kAlice = {{"Authorization", "Bearer sk-alice-0123456789"}};
const std::map<std::string, std::string> kBob = {{"Authorization", "Bearer sk-bob-0123456789ab"}};

HttpResponse Create(int port, const json& body, const std::map<std::string, std::string>& key) {
  json b = body;
  b["model"] = "tiny";
  b["max_output_tokens"] = 2;
  return Http(port, "POST", "/v1/responses", b.dump(), key);
}

// One round of the attack; the status of its first request, and the
// continuation's id when every step succeeded.
struct Round {
  int created = 0;
  std::string kept;
};
Round AttackRound(int port, const std::string& png, const std::map<std::string, std::string>& key) {
  Round out;
  auto first = Create(port, json{{"input", ImageInput(PngDataUrl(png))}}, key);
  out.created = first.status;
  if (first.status != 200) return out;
  const std::string first_id = first.Json()["id"];
  auto next = Create(port, json{{"input", "And now?"}, {"previous_response_id", first_id}}, key);
  EXPECT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(Http(port, "DELETE", "/v1/responses/" + first_id, "", key).status, 200);
  out.kept = next.Json().value("id", "");
  return out;
}

TEST(ResponsesImageQuota, ContinuedImagesCountUntilTheLastResponseNamingThemGoes) {
  // Files of about 90 KB that do not compress; the rows around them are a few KB.
  std::vector<std::string> pictures;
  for (uint32_t seed = 1; seed <= 5; ++seed) pictures.push_back(NoisyPng(200, 150, seed));
  const int64_t file = static_cast<int64_t>(pictures[0].size());
  DaemonConfig c = TestConfig();
  c.model = VisionModelDir();
  c.state_dir = ::testing::TempDir() + "/moe_responses_image_quota_" + std::to_string(::getpid());
  std::filesystem::remove_all(c.state_dir);
  std::filesystem::create_directories(c.state_dir);
  c.api_keys_file = c.state_dir + "/keys.yaml";
  std::ofstream(c.api_keys_file) << "keys:\n  - {key: sk-alice-0123456789, tenant: alice}\n"
                                    "  - {key: sk-bob-0123456789ab, tenant: bob}\n";
  c.sessions.tenant_quota_bytes = file * 5 / 2;  // two files and their rows, not three
  c.sessions.total_quota_bytes = file * 7 / 2;   // three files and their rows, not four
  const std::string db = c.state_dir + "/sessions.sqlite3";
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  const int port = PortOf(*d);

  // Alice: two rounds fit; the third file does not, though each round deleted the response that sent it.
  std::vector<std::string> alices;
  for (int round = 0; round < 2; ++round) {
    Round r = AttackRound(port, pictures[round], kAlice);
    ASSERT_EQ(r.created, 200) << "round " << round;
    alices.push_back(r.kept);
    EXPECT_LE(StoredImageBytes(db, "alice"), c.sessions.tenant_quota_bytes);
  }
  EXPECT_EQ(StoredImageBytes(db, "alice"), 2 * file);
  auto third = Create(port, json{{"input", ImageInput(PngDataUrl(pictures[2]))}}, kAlice);
  ASSERT_EQ(third.status, 403) << third.body;
  EXPECT_EQ(third.Json()["error"]["code"], "response_quota_exceeded") << third.body;
  EXPECT_EQ(StoredImageBytes(db, "alice"), 2 * file);  // nothing of the refused one is kept

  // Bob, within his own quota, meets the global cap on his second file.
  Round bobs = AttackRound(port, pictures[3], kBob);
  ASSERT_EQ(bobs.created, 200);
  auto over = Create(port, json{{"input", ImageInput(PngDataUrl(pictures[4]))}}, kBob);
  ASSERT_EQ(over.status, 507) << over.body;
  EXPECT_EQ(over.Json()["error"]["code"], "response_storage_full") << over.body;
  EXPECT_LE(StoredImageBytes(db), c.sessions.total_quota_bytes);
  EXPECT_EQ(StoredImageBytes(db), 3 * file);

  // A session's global check counts the responses' files too: half a file of text no longer fits.
  auto session = Http(port, "POST", "/v1/sessions", json{{"system", "s"}}.dump(), kBob);
  ASSERT_EQ(session.status, 200) << session.body;
  const std::string sid = session.Json()["id"];
  auto turn = Http(port, "POST", "/v1/sessions/" + sid + "/chat/completions",
                   json{{"messages", UserTurn(std::string(static_cast<size_t>(file / 2), 'x'))}, {"max_tokens", 2}}.dump(),
                   kBob);
  ASSERT_EQ(turn.status, 507) << turn.body.substr(0, 400);
  EXPECT_EQ(turn.Json()["error"]["code"], "session_storage_full");

  // The files go with the last response naming them, and the room comes back.
  for (const std::string& id : alices) ASSERT_EQ(Http(port, "DELETE", "/v1/responses/" + id, "", kAlice).status, 200);
  EXPECT_EQ(StoredImageBytes(db, "alice"), 0);
  EXPECT_EQ(Create(port, json{{"input", ImageInput(PngDataUrl(pictures[2]))}}, kAlice).status, 200);
  d->Shutdown(1);
  std::filesystem::remove_all(c.state_dir);
}

}  // namespace
}  // namespace moeserve::daemon::testing
