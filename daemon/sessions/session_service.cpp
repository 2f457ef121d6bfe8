#include "moeserve/daemon/sessions/session_service.hpp"

#include <openssl/rand.h>

#include <random>
#include <shared_mutex>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/daemon/sessions/session_history.hpp"
#include "moeserve/daemon/image/stored_images.hpp"
#include "moeserve/engine/engine.hpp"
#include "sessions/session_forward.hpp"
#include "sessions/session_turn_exchange.hpp"

namespace moeserve::daemon {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

namespace {

constexpr char kForwardedHeader[] = "x-moe-session-forwarded";
constexpr size_t kIdRandomChars = 24;
constexpr size_t kMaxMetadataBytes = 16 << 10;

double WallNow() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

ApiError NotFound(const std::string& id) {
  return ApiError{404,
                  "invalid_request_error",
                  "session_not_found",
                  "No session '" + id + "' for this API key (it may have expired or been deleted)",
                  "",
                  0};
}

ApiError Busy(const std::string& id) {
  return ApiError{409,
                  "invalid_request_error",
                  "session_busy",
                  "Session '" + id +
                      "' is answering another turn; wait for that answer, then "
                      "send this turn again "
                      "(turns of one session are not queued)",
                  "",
                  0};
}

ApiError BadId(const std::string& id) {
  std::string shown = id.size() > 80 ? id.substr(0, 80) + "..." : id;
  return ApiError{400,
                  "invalid_request_error",
                  "invalid_session_id",
                  "'" + shown +
                      "' is not a session id (expected sess_<replica>_<24 "
                      "letters and digits>)",
                  "session_id",
                  0};
}

ApiError QuotaExceeded(const std::string& tenant, int64_t used, int64_t adding, int64_t quota) {
  return ApiError{403,
                  "permission_error",
                  "session_quota_exceeded",
                  "Tenant '" + tenant + "' stores " + std::to_string(used) + " bytes of sessions; this request adds " +
                      std::to_string(adding) + " and the quota is " + std::to_string(quota) +
                      " bytes. Delete sessions (DELETE /v1/sessions/{id}) or "
                      "wait for idle ones to expire",
                  "",
                  0};
}

// The prefix cache's pin of a session (Engine::PinPrefix): FNV-1a of its id, never 0.
uint64_t PinKey(const std::string& id) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : id) h = (h ^ c) * 0x100000001b3ull;
  return h | 1;
}

std::string NewSessionId(const std::string& replica) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char raw[kIdRandomChars];
  if (RAND_bytes(raw, sizeof raw) != 1) {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    for (auto& b : raw) b = static_cast<unsigned char>(rng());
  }
  std::string id = "sess_" + replica + "_";
  for (unsigned char b : raw) id += kAlphabet[b % 62];
  return id;
}

// The replica a session id names, or nothing when it is not an id.
std::optional<std::string> ReplicaOf(const std::string& id) {
  if (!id.starts_with("sess_") || id.size() < 5 + 1 + 1 + kIdRandomChars) return std::nullopt;
  const size_t us = id.size() - kIdRandomChars - 1;
  if (id[us] != '_') return std::nullopt;
  for (size_t i = us + 1; i < id.size(); ++i)
    if (!std::isalnum(static_cast<unsigned char>(id[i]))) return std::nullopt;
  std::string replica = id.substr(5, us - 5);
  if (!ValidReplicaName(replica)) return std::nullopt;
  return replica;
}

bool QueryFlag(const std::string& query, const std::string& name) {
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    std::string item = query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
    if (item == name + "=1" || item == name + "=true" || item == name) return true;
    if (amp == std::string::npos) break;
    pos = amp + 1;
  }
  return false;
}

// A body as a JSON object within the request limits, or a 400.
ApiResult<ojson> ParseObject(const std::string& body, bool empty_is_object) {
  if (body.empty()) {
    if (empty_is_object) return ojson::object();
    return ApiFail(ApiError::InvalidRequest("The request body is empty; expected a JSON object"));
  }
  if (auto v = FindJsonLimitViolation(body, kRequestJsonLimits)) {
    return ApiFail(ApiError::InvalidRequest("The request body " + v->message));
  }
  ojson parsed = ojson::parse(body, nullptr, false);
  if (parsed.is_discarded()) return ApiFail(ApiError::InvalidRequest("The request body is not valid JSON"));
  if (!parsed.is_object()) return ApiFail(ApiError::InvalidRequest("The request body must be a JSON object"));
  return parsed;
}

// An OpenAI message for each message (the stateless endpoint's input form).
// Kept images become image_url parts naming them by hash (stored_images.hpp)
// at their place in the text.
ojson MessageJson(const engine::ChatMessage& m) {
  ojson j = {{"role", std::string(engine::ChatRoleName(m.role))}, {"content", m.content}};
  if (!m.images.empty()) {
    ojson parts = ojson::array();
    size_t done = 0;
    for (const auto& image : m.images) {
      const size_t at = std::min(image.at, m.content.size());
      if (at > done) parts.push_back({{"type", "text"}, {"text", m.content.substr(done, at - done)}});
      done = std::max(done, at);
      parts.push_back({{"type", "image_url"}, {"image_url", {{"url", StoredImageUrl(image.image.content_hash)}}}});
    }
    if (done < m.content.size()) parts.push_back({{"type", "text"}, {"text", m.content.substr(done)}});
    j["content"] = std::move(parts);
  }
  if (m.role == engine::ChatRole::kAssistant) {
    if (m.reasoning) j["reasoning_content"] = *m.reasoning;
    if (!m.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const auto& c : m.tool_calls) {
        calls.push_back({{"id", c.id},
                         {"type", "function"},
                         {"function",
                          {{"name", c.name},
                           // A string value is text that was not JSON: sent back as that text (session_history.cpp).
                           {"arguments", c.arguments.is_string()
                                             ? c.arguments.get<std::string>()
                                             : c.arguments.dump(-1, ' ', false, ojson::error_handler_t::replace)}}}});
      }
      j["tool_calls"] = std::move(calls);
    }
  }
  if (m.role == engine::ChatRole::kTool) j["tool_call_id"] = m.tool_call_id;
  return j;
}

// "messages[57].content" of the whole conversation is "messages[3].content" of
// the turn.
std::string TurnParam(const std::string& param, size_t history) {
  if (!param.starts_with("messages[")) return param;
  size_t close = param.find(']');
  size_t index = 0;
  try {
    index = std::stoul(param.substr(9, close - 9));
  } catch (...) {
    return param;
  }
  if (index < history) return "messages";
  return "messages[" + std::to_string(index - history) + param.substr(close);
}

}  // namespace

struct SessionService::Impl : std::enable_shared_from_this<SessionService::Impl> {
  SessionSettings settings;
  BudgetService& budget;
  SessionStore& store;
  std::atomic<ChatService*> chat{nullptr};
  // Set before `chat` (read only once chat is set).
  Scheduler* scheduler = nullptr;
  std::shared_ptr<const ChatDialect> model;  // the served family's chat: counts, summaries, pins

  std::mutex busy_mu;
  std::set<std::string> busy;

  std::mutex sweep_mu;
  std::condition_variable sweep_cv;
  bool stopping = false;
  // Callbacks that outlive a request (the model's summary, after the turn)
  // touch the store or the scheduler only under a shared lock while this is
  // false; the service's destructor sets it under the exclusive lock first.
  std::shared_mutex life_mu;
  bool closed = false;
  std::thread sweeper;

  Impl(SessionSettings s, BudgetService& b, SessionStore& st) : settings(std::move(s)), budget(b), store(st) {}

  bool TryBusy(const std::string& id) {
    std::lock_guard lock(busy_mu);
    return busy.insert(id).second;
  }
  void Release(const std::string& id) {
    std::lock_guard lock(busy_mu);
    busy.erase(id);
  }
  // Releases a session's busy mark when its turn ends before the turn's
  // exchange has taken it over (handed_over), on any early return.
  struct BusyGuard {
    Impl* impl;
    const std::string& id;
    bool& handed_over;
    ~BusyGuard() {
      if (!handed_over) impl->Release(id);
    }
  };

  // The session for `who`, or 404 (unknown, another tenant's, or idle past the
  // limit).
  ApiResult<SessionRecord> Load(const std::string& id, const Principal& who) {
    auto rec = store.Get(id);
    if (!rec) return ApiFail(ApiError::Internal("The session store could not be read: " + rec.error().message()));
    if (!*rec || (*rec)->tenant != who.tenant) return ApiFail(NotFound(id));
    if ((*rec)->last_active < WallNow() - settings.idle_seconds) return ApiFail(NotFound(id));
    return std::move(**rec);
  }

  ApiResult<void> CheckQuota(const std::string& tenant, int64_t adding) {
    if (adding <= 0) return {};
    auto used = store.TenantBytes(tenant);
    if (!used) return ApiFail(ApiError::Internal("The session store could not be read: " + used.error().message()));
    if (*used + adding > settings.tenant_quota_bytes) {
      return ApiFail(QuotaExceeded(tenant, *used, adding, settings.tenant_quota_bytes));
    }
    // The global cap keeps the state volume from filling, whoever fills it:
    // the usage ledger beside the sessions must always be able to commit.
    auto total = store.TotalBytes();
    if (!total) return ApiFail(ApiError::Internal("The session store could not be read: " + total.error().message()));
    if (*total + adding > settings.total_quota_bytes) {
      return ApiFail(ApiError{507, "server_error", "session_storage_full",
                              "The daemon's sessions (every tenant's) take " + std::to_string(*total) +
                                  " bytes; this request adds " + std::to_string(adding) +
                                  " and the global cap (session_total_quota_bytes) is " +
                                  std::to_string(settings.total_quota_bytes) +
                                  " bytes. Delete sessions (DELETE /v1/sessions/{id}) or wait for idle ones to expire; "
                                  "requests without a session are served",
                              "", 0});
    }
    return {};
  }

  // The pixels of the images the history's entries name, decoded from the
  // tenant's stored files.
  ApiResult<StoredImages> KeptImages(const std::vector<SessionEntry>& history, const std::string& tenant,
                                     const ImageLimits& limits, ImageWork* work) {
    std::vector<std::string> hashes;
    for (const auto& e : history)
      for (const auto& image : e.images)
        if (std::find(hashes.begin(), hashes.end(), image.hash) == hashes.end()) hashes.push_back(image.hash);
    StoredImages out;
    if (hashes.empty()) return out;
    auto files = store.ImageFiles(tenant, hashes);
    if (!files) return ApiFail(ApiError::Internal("The session store could not be read: " + files.error().message()));
    for (const auto& f : *files) {
      auto input = ReplayStoredImage(f, tenant, limits, work);
      if (!input) return ApiFail(ApiError::Internal("A kept image of the session could not be replayed: " +
                                                    input.error().message()));
      out.emplace(f.hash, std::move(*input));
    }
    if (out.size() != hashes.size())
      return ApiFail(ApiError::Internal("A kept image of the session is missing from the store"));
    return out;
  }

  // The turn's image files the session does not keep yet, each once.
  static std::vector<StoredImageFile> NewImageFiles(const std::vector<SessionEntry>& all,
                                                    const std::vector<InternedImage>& interned) {
    std::set<std::string> known;
    for (const auto& e : all)
      for (const auto& image : e.images) known.insert(image.hash);
    std::vector<StoredImageFile> out;
    for (const auto& image : interned)
      if (known.insert(image.file.hash).second) out.push_back(image.file);
    return out;
  }

  ojson SessionJson(const SessionRecord& r, const std::vector<SessionEntry>& all, bool full) const {
    ojson entries = ojson::array();
    if (full) {
      for (const auto& e : all) entries.push_back(e.ToJson());
    } else {
      for (const auto& e : ActiveInRenderOrder(all)) entries.push_back(e.ToJson());
    }
    return {{"id", r.id},
            {"object", "session"},
            {"created_at", r.created_at},
            {"last_active_at", r.last_active},
            {"expires_at", r.last_active + settings.idle_seconds},
            {"model", r.model.empty() ? ojson(nullptr) : ojson(r.model)},
            {"reasoning_effort", r.reasoning_effort.empty() ? ojson(nullptr) : ojson(r.reasoning_effort)},
            {"tools", r.tools},
            {"context_policy", r.context_policy},
            {"metadata", r.metadata},
            {"bytes", r.bytes},
            {"entries", std::move(entries)}};
  }

  void Create(const std::string& body, HttpExchange& ex, const Principal& who);
  void Get(const std::string& id, const std::string& query, HttpExchange& ex, const Principal& who);
  void Delete(const std::string& id, HttpExchange& ex, const Principal& who);
  void Turn(const std::string& id, const std::string& body, std::shared_ptr<HttpExchange> ex, const Principal& who,
            Clock::time_point received);
  // A turn once parsed against its history and admitted: its images fetched
  // and decoded, the kept ones replayed (on an image worker when there are
  // any: chat_service.hpp AdmitBeforeImages), then run. It owns the
  // session's busy mark from here on.
  struct TurnState {
    std::string id;
    std::shared_ptr<HttpExchange> ex;
    Principal who;
    Clock::time_point received;
    SessionRecord rec;
    std::vector<SessionEntry> all, history;
    std::vector<engine::ChatMessage> history_messages;
    ojson whole;
    ChatRequest request;
    ImagePartPlan plan;
    std::shared_ptr<ChatService::EarlyAdmission> admitted;  // null: no image work, admitted by ChatService
  };
  void TurnAdmitted(ChatService& chat_service, TurnState st);
  // A turn's images: its new ones decoded once and named by hash (their
  // files to store), the history's kept ones replayed; its messages with
  // their images in place. Refused past the session's image bytes.
  struct TurnImages {
    StoredImages images;
    std::vector<engine::ChatMessage> incoming_messages;
    std::vector<StoredImageFile> new_files;
    int64_t new_bytes = 0;
  };
  ApiResult<TurnImages> PrepareTurnImages(TurnState& st, const ServingFacts& facts);
  void Summarize(const std::string& session_id, const Principal& who, int64_t summary_seq,
                 std::vector<SessionEntry> replaced);
  void SweepLoop();
};

void SessionService::Impl::Create(const std::string& body, HttpExchange& ex, const Principal& who) {
  auto parsed = ParseObject(body, /*empty_is_object=*/true);
  if (!parsed) return ReplyError(ex, parsed.error());
  const ojson& b = *parsed;
  SessionRecord r;
  r.tenant = who.tenant;
  r.created_at = r.last_active = WallNow();
  std::vector<engine::ChatMessage> system;
  if (auto it = b.find("system"); it != b.end() && !it->is_null()) {
    if (!it->is_string()) return ReplyError(ex, ApiError::InvalidRequest("'system' must be a string", "system"));
    if (!it->get<std::string>().empty())
      system.push_back({engine::ChatRole::kSystem, it->get<std::string>(), std::nullopt, {}, ""});
  }
  if (auto it = b.find("tools"); it != b.end() && !it->is_null()) {
    // The stateless endpoint's own checks, on a one-message conversation.
    ojson probe = {{"messages", ojson::array({{{"role", "user"}, {"content", ""}}})}, {"tools", *it}};
    auto checked = ParseChatRequestJson(probe);
    if (!checked) return ReplyError(ex, checked.error());
    r.tools = checked->tools;
  }
  if (auto it = b.find("model"); it != b.end() && !it->is_null()) {
    if (!it->is_string()) return ReplyError(ex, ApiError::InvalidRequest("'model' must be a string", "model"));
    r.model = it->get<std::string>();
    ChatService* c = chat.load();
    if (c && !r.model.empty() && r.model != c->facts().model_name)
      return ReplyError(ex, ApiError::ModelNotFound(r.model));
  }
  if (auto it = b.find("reasoning_effort"); it != b.end() && !it->is_null()) {
    if (!it->is_string() || !ParseReasoningEffort(it->get<std::string>())) {
      return ReplyError(ex,
                        ApiError::InvalidRequest("'reasoning_effort' must be low, medium or high", "reasoning_effort"));
    }
    r.reasoning_effort = it->get<std::string>();
  }
  if (auto it = b.find("context_policy"); it != b.end() && !it->is_null()) {
    if (!it->is_object())
      return ReplyError(ex, ApiError::InvalidRequest("'context_policy' must be an object", "context_policy"));
    for (const auto& [key, value] : it->items()) {
      const std::string p = "context_policy." + key;
      if (key != "max_context_tokens" && key != "keep_recent_exchanges") {
        return ReplyError(ex, ApiError::InvalidRequest("'" + p +
                                                           "' is not a setting; known: "
                                                           "max_context_tokens, keep_recent_exchanges",
                                                       p));
      }
      const int64_t lo = key == "max_context_tokens" ? 64 : 1;
      if (!value.is_number_integer() || value.get<int64_t>() < lo || value.get<int64_t>() > (int64_t{1} << 31)) {
        return ReplyError(
            ex, ApiError::InvalidRequest("'" + p + "' must be an integer of at least " + std::to_string(lo), p));
      }
      r.context_policy[key] = value;
    }
  }
  if (auto it = b.find("metadata"); it != b.end() && !it->is_null()) {
    if (!it->is_object()) return ReplyError(ex, ApiError::InvalidRequest("'metadata' must be an object", "metadata"));
    if (it->dump().size() > kMaxMetadataBytes) {
      return ReplyError(
          ex, ApiError::InvalidRequest("'metadata' may take at most " + std::to_string(kMaxMetadataBytes) + " bytes",
                                       "metadata"));
    }
    r.metadata = *it;
  }
  r.id = NewSessionId(settings.replica);
  // The family counts the system prompt's tokens once the model is loaded;
  // a session created before that counts it in bytes (display only: the
  // system entry is never compressed).
  ChatService* attached = chat.load();
  auto entries = attached ? EntriesFromMessages(system, 1, r.created_at,
                                                [m = model](const SessionEntry& e) { return m->EntryTokens(TranscriptOf(e)); })
                          : EntriesFromMessages(system, 1, r.created_at);
  r.next_seq = 1 + static_cast<int64_t>(entries.size());
  r.bytes = static_cast<int64_t>(r.tools.dump().size() + r.metadata.dump().size()) + 128;
  for (const auto& e : entries) r.bytes += e.StoredBytes();
  if (auto q = CheckQuota(who.tenant, r.bytes); !q) return ReplyError(ex, q.error());
  SessionRecord shown = r;
  auto st = store.Wait([&](SessionStore::Done done) { store.Create(std::move(r), entries, std::move(done)); });
  if (!st) return ReplyError(ex, ApiError::Internal("The session could not be stored: " + st.error().message()));
  ReplyJson(ex, 200, SessionJson(shown, entries, false).dump(-1, ' ', false, ojson::error_handler_t::replace));
}

void SessionService::Impl::Get(const std::string& id, const std::string& query, HttpExchange& ex,
                               const Principal& who) {
  auto r = Load(id, who);
  if (!r) return ReplyError(ex, r.error());
  auto entries = store.Entries(id);
  if (!entries)
    return ReplyError(ex, ApiError::Internal("The session store could not be read: " + entries.error().message()));
  ReplyJson(ex, 200,
            SessionJson(*r, *entries, QueryFlag(query, "full")).dump(-1, ' ', false, ojson::error_handler_t::replace));
}

void SessionService::Impl::Delete(const std::string& id, HttpExchange& ex, const Principal& who) {
  auto r = Load(id, who);
  if (!r) return ReplyError(ex, r.error());
  if (!TryBusy(id)) return ReplyError(ex, Busy(id));
  auto st = store.Wait([&](SessionStore::Done done) { store.Delete(id, std::move(done)); });
  if (chat.load()) model->Unpin(PinKey(id));
  Release(id);
  if (!st && st.error().code() == ErrorCode::kNotFound) return ReplyError(ex, NotFound(id));
  if (!st) return ReplyError(ex, ApiError::Internal("The session could not be deleted: " + st.error().message()));
  ReplyJson(ex, 200, ojson{{"id", id}, {"object", "session.deleted"}, {"deleted", true}}.dump());
}

void SessionService::Impl::Turn(const std::string& id, const std::string& body, std::shared_ptr<HttpExchange> ex,
                                const Principal& who, Clock::time_point received) {
  ChatService* chat_service = chat.load();
  if (!chat_service) return ReplyError(*ex, ApiError::Unavailable("The model is not ready yet; retry shortly", 5));
  auto parsed = ParseObject(body, /*empty_is_object=*/false);
  if (!parsed) return ReplyError(*ex, parsed.error());
  ojson turn = std::move(*parsed);
  auto msgs = turn.find("messages");
  if (msgs == turn.end() || !msgs->is_array() || msgs->empty()) {
    return ReplyError(
        *ex, ApiError::InvalidRequest("'messages' must hold the turn's new messages (at least one)", "messages"));
  }
  if (turn.contains("tools")) {
    return ReplyError(*ex, ApiError::InvalidRequest("'tools' are the session's, set when it "
                                                    "is created; a turn may not change them",
                                                    "tools"));
  }
  if (!TryBusy(id)) return ReplyError(*ex, Busy(id));
  // Released when the turn ends, answered or not (SessionTurnExchange's
  // on_end), or here on an early error.
  bool handed_over = false;
  auto self = shared_from_this();
  BusyGuard guard{this, id, handed_over};

  auto rec = Load(id, who);
  if (!rec) return ReplyError(*ex, rec.error());
  auto all = store.Entries(id);
  if (!all) return ReplyError(*ex, ApiError::Internal("The session store could not be read: " + all.error().message()));
  std::vector<SessionEntry> history = ActiveInRenderOrder(*all);
  std::vector<engine::ChatMessage> history_messages = MessagesFromEntries(history);

  // The whole conversation through the stateless endpoint's parser: the new
  // messages are checked in the context of the history (tool chains included).
  ojson whole = turn;
  ojson messages = ojson::array();
  for (const auto& m : history_messages) messages.push_back(MessageJson(m));
  for (const auto& m : *msgs) messages.push_back(m);
  whole["messages"] = messages;
  if (!rec->tools.is_null()) whole["tools"] = rec->tools;
  if (!rec->reasoning_effort.empty() && !whole.contains("reasoning_effort"))
    whole["reasoning_effort"] = rec->reasoning_effort;
  if (!rec->model.empty() && !whole.contains("model")) whole["model"] = rec->model;
  auto request = ParseChatRequestJson(whole);
  if (!request) {
    ApiError e = request.error();
    e.param = TurnParam(e.param, history_messages.size());
    return ReplyError(*ex, e);
  }
  // The turn's image parts checked, nothing fetched or decoded: a turn with
  // image work (new images, or kept ones to replay) is admitted first, and
  // that work runs on an image worker.
  const ServingFacts& facts = chat_service->facts();
  const size_t first_new = history_messages.size();
  auto plan = PlanImageParts(whole["messages"], first_new, facts.images, facts.vision ? &*facts.vision : nullptr,
                             [&](const std::string& p) { return TurnParam(p, first_new); });
  if (!plan) return ReplyError(*ex, plan.error());
  const bool kept_images =
      std::any_of(history.begin(), history.end(), [](const SessionEntry& e) { return !e.images.empty(); });
  const bool image_work = !plan->found.empty() || kept_images;
  TurnState st{id,       ex,
               who,      received,
               std::move(*rec), std::move(*all),
               std::move(history), std::move(history_messages),
               std::move(whole), std::move(*request),
               std::move(*plan), nullptr};
  if (!image_work) {
    handed_over = true;
    return TurnAdmitted(*chat_service, std::move(st));
  }
  auto early = chat_service->AdmitBeforeImages(who, st.request.reasoning_effort);
  if (!early) return chat_service->Refuse(*ex, received, early.error());
  st.admitted = std::move(*early);
  auto shared = std::make_shared<TurnState>(std::move(st));
  auto queued = chat_service->RunImageWork(
      who, [self, chat_service, shared] { self->TurnAdmitted(*chat_service, std::move(*shared)); });
  if (!queued) return chat_service->Refuse(*ex, received, queued.error());
  handed_over = true;
}

ApiResult<SessionService::Impl::TurnImages> SessionService::Impl::PrepareTurnImages(TurnState& st,
                                                                                  const ServingFacts& facts) {
  const engine::VisionConfig* vision = facts.vision ? &*facts.vision : nullptr;
  // The turn's images decoded once and named by hash from here on; the
  // history's kept ones replayed from the decoded-image cache, or decoded
  // from the store.
  auto interned = InternImageParts(st.whole["messages"], std::move(st.plan), facts.images, vision, facts.image_work,
                                   st.who.tenant);
  if (!interned) return ApiFail(interned.error());
  auto kept = KeptImages(st.history, st.who.tenant, facts.images.limits, facts.image_work);
  if (!kept) return ApiFail(kept.error());
  TurnImages out;
  out.images = std::move(*kept);
  out.incoming_messages.assign(st.request.messages.begin() + static_cast<long>(st.history_messages.size()),
                               st.request.messages.end());
  for (const InternedImage& image : *interned) {
    out.incoming_messages[image.message - st.history_messages.size()].images.push_back({image.text_offset, image.input});
    out.images.emplace(image.file.hash, image.input);
  }
  out.new_files = NewImageFiles(st.all, *interned);
  for (const auto& f : out.new_files) out.new_bytes += static_cast<int64_t>(f.bytes.size());
  if (out.new_bytes > 0) {
    auto stored = store.SessionImageBytes(st.id);
    if (!stored) return ApiFail(ApiError::Internal("The session store could not be read: " + stored.error().message()));
    if (*stored + out.new_bytes > settings.image_max_bytes) {
      return ApiFail(ApiError::InvalidRequest(
          "Session '" + st.id + "' keeps " + std::to_string(*stored) + " bytes of images; this turn's new images add " +
              std::to_string(out.new_bytes) + " and the limit is " + std::to_string(settings.image_max_bytes) +
              " bytes a session (session_image_max_bytes); start a new session or send smaller images",
          "messages"));
    }
  }
  return out;
}

void SessionService::Impl::TurnAdmitted(ChatService& chat, TurnState st) {
  ChatService* chat_service = &chat;
  const std::string& id = st.id;
  std::shared_ptr<HttpExchange>& ex = st.ex;
  const Principal& who = st.who;
  const Clock::time_point received = st.received;
  SessionRecord* rec = &st.rec;
  std::vector<SessionEntry>& history = st.history;
  std::vector<engine::ChatMessage>& history_messages = st.history_messages;
  ojson& whole = st.whole;
  ChatRequest* request = &st.request;
  bool handed_over = false;
  auto self = shared_from_this();
  BusyGuard guard{this, id, handed_over};

  const ServingFacts& facts = chat_service->facts();
  const engine::VisionConfig* vision = facts.vision ? &*facts.vision : nullptr;
  auto turn_images = PrepareTurnImages(st, facts);
  if (!turn_images) return ReplyError(*ex, turn_images.error());
  StoredImages& images = turn_images->images;
  std::vector<engine::ChatMessage>& incoming_messages = turn_images->incoming_messages;
  auto& new_files = turn_images->new_files;
  const int64_t new_image_bytes = turn_images->new_bytes;
  for (size_t i = 0; i < incoming_messages.size(); ++i) {
    if (incoming_messages[i].role == engine::ChatRole::kSystem) {
      const std::string p = "messages[" + std::to_string(i) + "].role";
      return ReplyError(*ex, ApiError::InvalidRequest("'" + p +
                                                          "': the session's system message is set when "
                                                          "it is created; a turn may not add one",
                                                      p));
    }
  }
  const double now = WallNow();
  const EntryTokenCounter entry_tokens = [m = model](const SessionEntry& e) { return m->EntryTokens(TranscriptOf(e)); };
  auto incoming = EntriesFromMessages(incoming_messages, rec->next_seq, now, entry_tokens, vision);
  int64_t adding = new_image_bytes;
  for (const auto& e : incoming) adding += e.StoredBytes();
  if (auto q = CheckQuota(who.tenant, adding); !q) return ReplyError(*ex, q.error());

  // The context policy.
  int64_t budget_tokens = rec->context_policy.value("max_context_tokens", settings.context_tokens);
  if (budget_tokens <= 0 || budget_tokens > facts.max_context) budget_tokens = facts.max_context;
  const int64_t answer =
      request->max_tokens.value_or(std::min<int>(facts.default_max_tokens, static_cast<int>(budget_tokens / 4)));
  CompressionLimits limits;
  limits.budget_tokens = budget_tokens - answer;
  limits.keep_recent = static_cast<int>(
      rec->context_policy.value("keep_recent_exchanges", static_cast<int64_t>(settings.keep_exchanges)));
  limits.summary_max_bytes = static_cast<size_t>(settings.summary_max_tokens);
  const ojson tools = rec->tools;
  TokenCounter count = [&](const std::vector<engine::ChatMessage>& m) -> int64_t {
    return model->PromptTokens(m, tools, *request).value_or(INT64_MAX);
  };
  auto plan = PlanCompression(history, incoming, limits, count, entry_tokens);
  std::optional<SessionEntry> summary;
  std::vector<SessionEntry> replaced_originals;
  if (plan) {
    // The summary takes the next seq; the turn's entries follow it.
    for (auto& e : plan->history) {
      if (e.kind == EntryKind::kSummary && e.seq == 0) {
        e.seq = rec->next_seq;
        e.created_at = now;
        summary = e;
      }
    }
    incoming = EntriesFromMessages(incoming_messages, rec->next_seq + 1, now, entry_tokens, vision);
    for (const auto& e : history)
      if (std::find(plan->replaced.begin(), plan->replaced.end(), e.seq) != plan->replaced.end())
        replaced_originals.push_back(e);
    history = plan->history;
    ojson compressed = ojson::array();
    for (const auto& m : MessagesFromEntries(history)) compressed.push_back(MessageJson(m));
    // The turn's messages as rewritten above (its images named by hash).
    const ojson& rewritten = whole["messages"];
    for (size_t i = history_messages.size(); i < rewritten.size(); ++i) compressed.push_back(rewritten[i]);
    whole["messages"] = std::move(compressed);
  }

  // The session's prompt stays cached until its next turn (within the pin share).
  if (settings.pin_seconds > 0) {
    std::vector<engine::ChatMessage> prompt_messages = MessagesFromEntries(history);
    prompt_messages.insert(prompt_messages.end(), incoming_messages.begin(), incoming_messages.end());
    model->PinPrompt(PinKey(id), prompt_messages, tools, settings.pin_seconds);
  }

  // The answer, once assembled, is stored with the turn before the client sees it acknowledged.
  auto write = std::make_shared<TurnWrite>();
  write->session_id = id;
  write->tenant = who.tenant;
  write->images = std::move(new_files);
  write->entries = incoming;
  write->summary = summary;
  if (plan) write->replaced = plan->replaced;
  const int64_t answer_seq = rec->next_seq + (summary ? 1 : 0) + static_cast<int64_t>(incoming.size());
  auto on_answer = [self, write, answer_seq, who, summary, replaced_originals, entry_tokens](
                       AssembledAnswer a, SessionTurnExchange::Release release, SessionTurnExchange::Refuse refuse) {
    engine::ChatMessage m;
    m.role = engine::ChatRole::kAssistant;
    m.content = a.content;
    if (!a.reasoning.empty()) m.reasoning = a.reasoning;
    for (auto& c : a.tool_calls) {
      auto value = engine::ToolCallArgumentsFromText(c.arguments, kRequestJsonLimits, "arguments");
      m.tool_calls.push_back({c.id, c.name, value ? *value : ojson(c.arguments)});
    }
    const double at = WallNow();
    for (auto& e : EntriesFromMessages({m}, answer_seq, at, entry_tokens)) write->entries.push_back(std::move(e));
    write->now = at;
    self->store.CommitTurn(
        *write, [self, release, refuse, id = write->session_id, who, summary, replaced_originals](const Status& st) {
          if (!st) {
            log::Error("session " + id + ": the turn could not be stored: " + st.error().message());
            refuse(st.error().code() == ErrorCode::kNotFound
                       ? NotFound(id)
                       : ApiError::Internal("The turn could not be stored (" + st.error().message() +
                                            "); it is not part of the session"));
            return;
          }
          release();
          if (summary) self->Summarize(id, who, summary->seq, replaced_originals);
        });
  };
  auto on_end = [self, id](bool) { self->Release(id); };
  auto capture = std::make_shared<SessionTurnExchange>(ex, std::move(on_answer), std::move(on_end));
  handed_over = true;
  chat_service->Handle(capture, whole.dump(-1, ' ', false, ojson::error_handler_t::replace), who, received,
                       &images, std::move(st.admitted));
}

// The model's summary: a low-tier generation from the fixed prompt, after
// the turn, charged to the tenant. It replaces the extractive text only when
// it is shorter than what it stands for.
namespace {

// Reads the summary's tokens with the family's reader: its content is the
// answer (for gpt-oss the final channel), never the reasoning. Output that
// breaks the family's format is no summary.
class SummarySink : public SequenceSink, public std::enable_shared_from_this<SummarySink> {
 public:
  using Finished = std::function<void(std::string text, engine::SequenceUsage usage, bool ok)>;
  SummarySink(std::unique_ptr<OutputReader> reader, Finished finished)
      : reader_(std::move(reader)), finished_(std::move(finished)) {}
  void OnEvent(const engine::TokenEvent& e) override {
    if (e.token >= 0) (void)reader_->OnToken(e.token, e.reasoning);
    if (e.finish == engine::FinishReason::kNone) return;
    (void)reader_->Finish();
    const bool ok = (e.finish == engine::FinishReason::kStop || e.finish == engine::FinishReason::kLength) &&
                    reader_->FormatFault().empty();
    finished_(reader_->content(), e.usage, ok);
  }

 private:
  std::unique_ptr<OutputReader> reader_;
  Finished finished_;
};

}  // namespace

void SessionService::Impl::Summarize(const std::string& session_id, const Principal& who, int64_t summary_seq,
                                     std::vector<SessionEntry> replaced) {
  std::shared_lock life(life_mu);
  if (closed) return;
  ChatService* c = chat.load();
  if (!c || !scheduler || replaced.empty()) return;
  if (!budget.Admit(who, "low")) return;  // the tenant may not spend: the extractive summary stays
  int64_t replaced_tokens = 0;
  for (const auto& e : replaced) replaced_tokens += e.tokens;
  const ServingFacts& facts = c->facts();
  // The low tier's reasoning budget; a tier without one (gpt-oss without
  // thinking_budgets) may reason as long as the summary may be.
  const int reasoning = facts.budgets.low >= 0 ? facts.budgets.low : settings.summary_max_tokens;
  const int max_tokens = settings.summary_max_tokens + reasoning;
  std::string transcript = SummarizationTranscript(replaced);
  const size_t room = static_cast<size_t>(std::max(64, facts.max_context - max_tokens - 512));
  if (transcript.size() > room) transcript = transcript.substr(transcript.size() - room);  // the newest part
  std::vector<engine::ChatMessage> prompt_messages = {
      {engine::ChatRole::kSystem, std::string(SummarizationPrompt()), std::nullopt, {}, ""},
      {engine::ChatRole::kUser, transcript, std::nullopt, {}, ""}};
  auto g = model->SummaryRequest(prompt_messages, max_tokens, reasoning, static_cast<uint64_t>(summary_seq));
  if (!g || static_cast<int64_t>(g->prompt.size()) + max_tokens > facts.max_context) return;
  g->tenant = who.tenant;  // its own tenant's prefix cache and fair share
  auto self = shared_from_this();
  auto finished = [self, session_id, who, summary_seq, replaced_tokens](std::string text, engine::SequenceUsage u,
                                                                        bool ok) {
    ChargeRecord charge{who.tenant,
                        "low",
                        {u.prompt_tokens - u.cached_tokens, u.cached_tokens, u.completion_tokens - u.reasoning_tokens,
                         u.reasoning_tokens}};
    self->budget.Charge(std::move(charge), [self, session_id, summary_seq, replaced_tokens, text, ok](const Status&) {
      // Counted as the family counts a summary entry, like the extractive one it replaces.
      SessionEntry written;
      written.role = engine::ChatRole::kSystem;
      written.kind = EntryKind::kSummary;
      written.content = text;
      const int64_t tokens = self->model->EntryTokens(TranscriptOf(written));
      if (!ok || text.empty() || tokens >= replaced_tokens) return;
      std::shared_lock life(self->life_mu);
      if (self->closed) return;
      self->store.ReplaceSummary(session_id, summary_seq, text, tokens, [session_id](const Status& st) {
        if (!st && st.error().code() != ErrorCode::kNotFound) {
          log::Warn("session " + session_id + ": the model's summary could not be stored: " + st.error().message());
        }
      });
    });
  };
  auto sink = std::make_shared<SummarySink>(model->MakeSummaryReader(), std::move(finished));
  if (auto id = scheduler->Submit(std::move(*g), sink); !id) {
    log::Info("session " + session_id + ": no model summary (" + id.error().message() + "); the extractive one stays");
  }
}

void SessionService::Impl::SweepLoop() {
  const auto every = std::chrono::duration<double>(std::clamp(settings.idle_seconds / 4, 0.2, 60.0));
  std::unique_lock lock(sweep_mu);
  while (!sweep_cv.wait_for(lock, every, [&] { return stopping; })) {
    lock.unlock();
    store.DeleteIdle(WallNow() - settings.idle_seconds, [](const Status& st) {
      if (!st) log::Warn("sessions: deleting idle sessions failed: " + st.error().message());
    });
    lock.lock();
  }
}

SessionService::SessionService(SessionSettings settings, BudgetService& budget)
    : settings_(std::move(settings)),
      budget_(budget),
      forwarder_(std::make_unique<PeerForwarder>(settings_.forward_max_in_flight, settings_.forward_deadline_seconds)) {}

Result<std::unique_ptr<SessionService>> SessionService::Create(SessionSettings settings, std::string db_path,
                                                               BudgetService& budget) {
  std::unique_ptr<SessionService> s(new SessionService(std::move(settings), budget));
  MOE_ASSIGN_OR_RETURN(s->store_, SessionStore::Open(db_path));
  s->impl_ = std::make_shared<Impl>(s->settings_, budget, *s->store_);
  s->impl_->sweeper = std::thread([impl = s->impl_.get()] { impl->SweepLoop(); });
  return s;
}

SessionService::~SessionService() {
  {
    std::unique_lock life(impl_->life_mu);
    impl_->closed = true;
  }
  {
    std::lock_guard lock(impl_->sweep_mu);
    impl_->stopping = true;
  }
  impl_->sweep_cv.notify_all();
  if (impl_->sweeper.joinable()) impl_->sweeper.join();
}

void SessionService::Attach(ChatService& chat, Scheduler& scheduler, std::shared_ptr<const ChatDialect> model) {
  impl_->scheduler = &scheduler;
  impl_->model = std::move(model);
  impl_->chat.store(&chat);
}

void SessionService::Create(std::string body, std::shared_ptr<HttpExchange> exchange, const Principal& who) {
  impl_->Create(body, *exchange, who);
}

ApiResult<void> SessionService::AdmitTurn(const HttpHead& head, const std::string& id, bool serving) const {
  if (!serving && head.Header(kForwardedHeader).empty() && ReplicaOf(id) == settings_.replica)
    return ApiFail(ApiError::Unavailable("The model is not ready yet; retry shortly", 5));
  return {};
}

void SessionService::OnSession(Op op, const std::string& id, const HttpHead& head, std::string body,
                               std::shared_ptr<HttpExchange> exchange, const Principal& who,
                               Clock::time_point received) {
  auto replica = ReplicaOf(id);
  if (!replica) return ReplyError(*exchange, BadId(id));
  if (*replica != settings_.replica) {
    auto peer = settings_.peers.find(*replica);
    // Forwarded once at most: a peer that does not own it either answers 404.
    if (peer == settings_.peers.end() || !head.Header(kForwardedHeader).empty())
      return ReplyError(*exchange, NotFound(id));
    return forwarder_->Forward(peer->second, head, std::move(body), std::move(exchange), kForwardedHeader);
  }
  switch (op) {
    case Op::kGet:
      return impl_->Get(id, head.query, *exchange, who);
    case Op::kDelete:
      return impl_->Delete(id, *exchange, who);
    case Op::kTurn:
      return impl_->Turn(id, body, std::move(exchange), who, received);
  }
}

}  // namespace moeserve::daemon
