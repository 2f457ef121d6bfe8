#include "moeserve/daemon/responses/response_service.hpp"

#include <chrono>
#include <future>

#include "sessions/session_forward.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/daemon/responses/response_output.hpp"
#include "response_exchange.hpp"

namespace moeserve::daemon {

using ojson = nlohmann::ordered_json;

namespace {

constexpr char kForwardedHeader[] = "x-moe-response-forwarded";
constexpr size_t kIdRandomChars = 24;

std::string Dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ApiError NotFound(const std::string& id, bool previous) {
  const std::string shown = id.size() > 80 ? id.substr(0, 80) + "..." : id;
  if (previous) {
    return ApiError{404, "invalid_request_error", "previous_response_not_found",
                    "Previous response with id '" + shown + "' not found.", "previous_response_id", 0};
  }
  return ApiError{404, "invalid_request_error", "response_not_found", "No response found with id '" + shown + "'.", "", 0};
}

// The replica a response id names, or nothing when it is not one of ours.
std::optional<std::string> ReplicaOf(const std::string& id) {
  constexpr std::string_view kIdPrefix = "resp_";
  if (!id.starts_with(kIdPrefix) || id.size() < kIdPrefix.size() + 2 + kIdRandomChars) return std::nullopt;
  const size_t us = id.size() - kIdRandomChars - 1;
  if (id[us] != '_') return std::nullopt;
  for (size_t i = us + 1; i < id.size(); ++i)
    if (!std::isalnum(static_cast<unsigned char>(id[i]))) return std::nullopt;
  std::string replica = id.substr(kIdPrefix.size(), us - kIdPrefix.size());
  if (!ValidReplicaName(replica)) return std::nullopt;
  return replica;
}

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

ApiError StoreError(const Error& e) {
  if (e.code() == ErrorCode::kOutOfRange) {
    return ApiError{507, "server_error", "response_storage_full",
                    "This response was not stored: " + e.message() + ". Send store: false, or retry later", "store", 0};
  }
  if (e.code() == ErrorCode::kResourceExhausted) {
    return ApiError{403, "permission_error", "response_quota_exceeded",
                    "This response was not stored: " + e.message() +
                        ". Delete stored responses (DELETE /v1/responses/{id}) or send store: false",
                    "store", 0};
  }
  return ApiError::Internal("The response could not be stored: " + e.message());
}

Status WaitFor(const std::function<void(SessionStore::Done)>& write) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto future = promise->get_future();
  write([promise](const Status& st) { promise->set_value(st); });
  return future.get();
}

// A background run that a restart interrupted is stored as in_progress with
// no run behind it.
ojson AsInterrupted(ojson response) {
  response["status"] = "failed";
  response["error"] = {{"code", "server_error"},
                       {"message", "The server restarted before this background response finished"}};
  return response;
}

}  // namespace

struct ResponseService::Run {
  std::mutex mu;
  std::string tenant;
  ojson shell;
  double created_at = 0;
  std::shared_ptr<ResponseExchange> exchange;
  bool ended = false;      // its end (or its cancellation) is decided
};

ResponseService::ResponseService(const SessionSettings& settings) : settings_(settings) {}

Result<std::unique_ptr<ResponseService>> ResponseService::Create(const SessionSettings& settings, SessionStore& store) {
  std::unique_ptr<ResponseService> s(new ResponseService(settings));
  MOE_ASSIGN_OR_RETURN(s->store_, ResponseStore::Open(store, settings.tenant_quota_bytes, settings.total_quota_bytes));
  s->forwarder_ = std::make_unique<PeerForwarder>(settings.forward_max_in_flight, settings.forward_deadline_seconds);
  return s;
}

ResponseService::~ResponseService() {
  // Runs still going end with the scheduler; nothing of theirs is stored after this.
  std::lock_guard lock(runs_mu_);
  for (auto& [id, run] : runs_) {
    std::lock_guard l(run->mu);
    run->ended = true;
  }
}

bool ResponseService::ForwardIfElsewhere(const std::string& id, const HttpHead& head, std::string& body,
                                         std::shared_ptr<HttpExchange>& exchange, bool& answered) {
  answered = false;
  auto replica = ReplicaOf(id);
  if (replica && *replica == settings_.replica) return false;
  auto peer = replica ? settings_.peers.find(*replica) : settings_.peers.end();
  if (peer == settings_.peers.end() || !head.Header(kForwardedHeader).empty()) {
    // Not an id any replica made, or one a peer sent back: nobody has it.
    answered = true;
    return false;
  }
  forwarder_->Forward(peer->second, head, std::move(body), std::move(exchange), kForwardedHeader);
  return true;
}

void ResponseService::Create(const HttpHead& head, std::string body, std::shared_ptr<HttpExchange> exchange,
                             const Principal& who, Clock::time_point received, const RunExchange& audit_run) {
  ChatService* chat = chat_.load();
  if (!chat) return ReplyError(*exchange, ApiError::Unavailable("The model is not ready yet; retry shortly", 5));
  auto req = ParseResponsesRequest(body);
  if (!req) return ReplyError(*exchange, req.error());
  ojson history = ojson::array();
  if (req->previous_response_id) {
    bool unknown = false;
    if (ForwardIfElsewhere(*req->previous_response_id, head, body, exchange, unknown)) return;
    if (unknown) return ReplyError(*exchange, NotFound(*req->previous_response_id, true));
    auto previous = store_->Get(who.tenant, *req->previous_response_id);
    if (!previous) return ReplyError(*exchange, ApiError::FromError(previous.error()));
    if (!*previous) return ReplyError(*exchange, NotFound(*req->previous_response_id, true));
    const std::string status = (*previous)->status;
    if (status != "completed" && status != "incomplete") {
      return ReplyError(*exchange, ApiError::InvalidRequest("Previous response '" + *req->previous_response_id + "' is " +
                                                                status + "; only a completed response can be continued",
                                                            "previous_response_id"));
    }
    history = std::move((*previous)->conversation);
  }
  // The new image parts checked, nothing fetched or decoded: a request with
  // image work (new images, or the previous response's to replay) is
  // admitted first, and that work runs on an image worker.
  const ServingFacts& facts = chat->facts();
  const size_t before = (req->instructions ? 1 : 0) + history.size();  // chat messages ahead of the new input
  auto plan = PlanImageParts(req->messages, 0, facts.images, facts.vision ? &*facts.vision : nullptr,
                             [before](const std::string& p) {
                               // The chat body's index, which RenameChatError maps back to the input's.
                               const size_t close = p.find(']');
                               const size_t k = std::stoul(p.substr(9, close - 9));
                               return "messages[" + std::to_string(before + k) + p.substr(close);
                             });
  if (!plan) return ReplyError(*exchange, RenameChatError(plan.error(), *req, history.size()));
  const bool image_work = !plan->found.empty() || !StoredImageHashesIn(history).empty();
  Creation c{std::move(*req), std::move(history), std::move(*plan), std::move(exchange), who, received, audit_run, nullptr};
  if (!image_work) return CreateAdmitted(*chat, std::move(c));
  std::optional<ReasoningEffort> effort;
  if (c.req.effort) effort = ParseReasoningEffort(*c.req.effort);
  auto early = chat->AdmitBeforeImages(who, effort);
  if (!early) return chat->Refuse(*c.exchange, received, early.error());
  c.admitted = std::move(*early);
  auto shared = std::make_shared<Creation>(std::move(c));
  auto queued = chat->RunImageWork(who, [this, chat, shared] {
    if (shared->exchange->client_gone()) return;
    CreateAdmitted(*chat, std::move(*shared));
  });
  if (!queued) return chat->Refuse(*shared->exchange, received, queued.error());
}

void ResponseService::CreateAdmitted(ChatService& chat_service, Creation c) {
  ChatService* chat = &chat_service;
  auto& req = c.req;
  auto& history = c.history;
  auto& exchange = c.exchange;
  const Principal& who = c.who;
  const auto received = c.received;
  const RunExchange& audit_run = c.audit_run;
  auto images = RequestImages(req, history, std::move(c.plan), chat->facts(), who.tenant);
  if (!images) return ReplyError(*exchange, images.error());
  const std::string chat_body = Dump(ChatBodyFor(req, history));
  const std::string id = "resp_" + settings_.replica + "_" + NewItemId("");
  const double created_at = UnixNow();
  ojson shell = ResponseShell(id, static_cast<int64_t>(created_at), chat->facts().model_name, req, "in_progress");
  if (req.background) {
    return Background(std::move(req), std::move(history), std::move(shell), chat_body, std::move(exchange), who,
                      received, audit_run, std::move(*images), std::move(c.admitted));
  }
  const bool store = req.store;
  ResponseExchange::Context context{std::move(req), std::move(history), shell};
  auto kept = std::make_shared<const ResponseImages>(std::move(*images));
  auto on_answer = [this, store, id, created_at, tenant = who.tenant, kept](ojson response, ojson conversation,
                                                                            ResponseExchange::Release release,
                                                                            ResponseExchange::Refuse refuse) {
    if (!store) return release();
    StoredResponse row{id,       tenant,       created_at,     response["status"], std::move(response),
                       std::move(conversation), kept->files};
    store_->Put(std::move(row), [release, refuse](const Status& st) {
      if (st) release();
      else refuse(StoreError(st.error()));
    });
  };
  auto translated = std::make_shared<ResponseExchange>(exchange, std::move(context), std::move(on_answer), nullptr);
  chat->Handle(translated, chat_body, who, received, &kept->pixels, std::move(c.admitted));
}

ApiResult<ResponseService::ResponseImages> ResponseService::RequestImages(ResponsesRequest& req, const ojson& history,
                                                                          ImagePartPlan plan, const ServingFacts& facts,
                                                                          const std::string& tenant) const {
  ResponseImages out;
  auto interned = InternImageParts(req.messages, std::move(plan), facts.images, facts.vision ? &*facts.vision : nullptr,
                                   facts.image_work, tenant);
  if (!interned) return ApiFail(RenameChatError(interned.error(), req, history.size()));
  const std::vector<std::string> hashes = StoredImageHashesIn(history);
  if (!hashes.empty()) {
    auto files = store_->ImageFiles(tenant, hashes);
    if (!files) return ApiFail(ApiError::FromError(files.error()));
    if (files->size() != hashes.size())
      return ApiFail(ApiError::Internal("An image of the previous response is missing from the store"));
    for (auto& f : *files) {
      auto input = ReplayStoredImage(f, tenant, facts.images.limits, facts.image_work);
      if (!input)
        return ApiFail(ApiError::Internal("An image of the previous response could not be replayed: " +
                                          input.error().message()));
      out.pixels.emplace(f.hash, std::move(*input));
      out.files.push_back(std::move(f));
    }
  }
  for (auto& image : *interned) {
    if (!out.pixels.emplace(image.file.hash, image.input).second) continue;  // the history's, or sent twice
    out.files.push_back(std::move(image.file));
  }
  return out;
}

void ResponseService::Background(ResponsesRequest req, ojson history, ojson shell, std::string chat_body,
                                 std::shared_ptr<HttpExchange> exchange, const Principal& who,
                                 Clock::time_point received, const RunExchange& audit_run, ResponseImages images,
                                 std::shared_ptr<ChatService::EarlyAdmission> admitted) {
  auto kept = std::make_shared<const ResponseImages>(std::move(images));
  const std::string id = shell["id"];
  auto run = std::make_shared<Run>();
  run->tenant = who.tenant;
  run->shell = shell;
  run->created_at = UnixNow();
  // Stored before it runs, so that a GET right after this answer finds it.
  if (auto st = WaitFor([&](SessionStore::Done done) {
        store_->Put({id, who.tenant, run->created_at, "in_progress", shell, ojson::array(), {}}, std::move(done));
      });
      !st) {
    return ReplyError(*exchange, StoreError(st.error()));
  }
  // Set while ChatService::Handle runs: a failure then is the request's own
  // (a 400, a 429) and goes to the client, not into the store.
  auto refused = std::make_shared<std::optional<ApiError>>();
  auto in_handle = std::make_shared<std::atomic<bool>>(true);
  // The run holds its exchange, which holds these callbacks: they hold the
  // run weakly (runs_ keeps it until its end is decided).
  auto finish = [this, weak = std::weak_ptr<Run>(run), id, kept](ojson response, ojson conversation,
                                                                std::function<void(const Status&)> then) {
    auto run = weak.lock();
    if (!run) return then(Ok());
    {
      std::lock_guard lock(run->mu);
      if (run->ended) return then(Ok());  // cancelled meanwhile: the cancellation stands
      run->ended = true;
    }
    {
      std::lock_guard lock(runs_mu_);
      runs_.erase(id);
    }
    const std::string status = response["status"];
    const bool completed = conversation.is_array() && !conversation.empty();
    store_->Put({id, run->tenant, run->created_at, status, std::move(response), std::move(conversation),
                 completed ? kept->files : std::vector<StoredImageFile>()},
                [id, then](const Status& st) {
                  if (!st) log::Warn("responses: background response " + id + " could not be stored: " + st.error().message());
                  then(st);
                });
  };
  auto on_answer = [finish](ojson response, ojson conversation, ResponseExchange::Release release,
                            ResponseExchange::Refuse) {
    finish(std::move(response), std::move(conversation), [release](const Status&) { release(); });
  };
  auto on_failure = [finish, refused, in_handle, shell](const ApiError& e) {
    if (in_handle->load()) {
      *refused = e;
      return;
    }
    ojson failed = shell;
    failed["status"] = "failed";
    failed["error"] = {{"code", e.code}, {"message", e.message}};
    finish(std::move(failed), ojson::array(), [](const Status&) {});
  };
  ResponseExchange::Context context{std::move(req), std::move(history), shell};
  run->exchange = std::make_shared<ResponseExchange>(nullptr, std::move(context), std::move(on_answer), std::move(on_failure));
  {
    std::lock_guard lock(runs_mu_);
    runs_[id] = run;
  }
  chat_.load()->Handle(audit_run ? audit_run(run->exchange) : run->exchange, chat_body, who, received, &kept->pixels,
                       std::move(admitted));
  in_handle->store(false);
  if (refused->has_value()) {
    {
      std::lock_guard lock(runs_mu_);
      runs_.erase(id);
    }
    store_->Delete(who.tenant, id, nullptr);
    return ReplyError(*exchange, **refused);
  }
  ReplyJson(*exchange, 200, Dump(shell));
}

std::shared_ptr<ResponseService::Run> ResponseService::FindRun(const std::string& tenant, const std::string& id) {
  std::lock_guard lock(runs_mu_);
  auto it = runs_.find(id);
  if (it == runs_.end() || it->second->tenant != tenant) return nullptr;
  return it->second;
}

bool ResponseService::AnsweredElsewhere(const std::string& id, const HttpHead& head, std::string& body,
                                        std::shared_ptr<HttpExchange>& exchange) {
  bool unknown = false;
  if (ForwardIfElsewhere(id, head, body, exchange, unknown)) return true;
  if (unknown) ReplyError(*exchange, NotFound(id, false));
  return unknown;
}

bool ResponseService::MarkEnded(Run& run) {
  std::lock_guard lock(run.mu);
  const bool was_running = !run.ended;
  run.ended = true;
  return was_running;
}

void ResponseService::StopRun(const std::string& id, Run& run) {
  {
    std::lock_guard lock(runs_mu_);
    runs_.erase(id);
  }
  run.exchange->Cancel();
}

void ResponseService::Get(const std::string& id, const HttpHead& head, std::string body,
                          std::shared_ptr<HttpExchange> exchange,
                          const Principal& who) {
  if (AnsweredElsewhere(id, head, body, exchange)) return;
  if (head.query.find("stream=true") != std::string::npos) {
    return ReplyError(*exchange, ApiError::InvalidRequest("Streaming a stored response again (stream=true) is not supported",
                                                          "stream"));
  }
  auto row = store_->Get(who.tenant, id);
  if (!row) return ReplyError(*exchange, ApiError::FromError(row.error()));
  if (!*row) return ReplyError(*exchange, NotFound(id, false));
  ojson response = std::move((*row)->response);
  if ((*row)->status == "in_progress" && !FindRun(who.tenant, id)) response = AsInterrupted(std::move(response));
  ReplyJson(*exchange, 200, Dump(response));
}

void ResponseService::Delete(const std::string& id, const HttpHead& head, std::string body,
                             std::shared_ptr<HttpExchange> exchange,
                             const Principal& who) {
  if (AnsweredElsewhere(id, head, body, exchange)) return;
  if (auto run = FindRun(who.tenant, id)) {
    // A running background response stops first: nothing of it is stored after the delete.
    MarkEnded(*run);
    StopRun(id, *run);
  }
  store_->Delete(who.tenant, id, [exchange, id](const Status& st) {
    if (!st && st.error().code() == ErrorCode::kNotFound) return ReplyError(*exchange, NotFound(id, false));
    if (!st) return ReplyError(*exchange, ApiError::FromError(st.error()));
    ReplyJson(*exchange, 200, Dump(ojson{{"id", id}, {"object", "response"}, {"deleted", true}}));
  });
}

void ResponseService::Cancel(const std::string& id, const HttpHead& head, std::string body,
                             std::shared_ptr<HttpExchange> exchange,
                             const Principal& who) {
  if (AnsweredElsewhere(id, head, body, exchange)) return;
  if (auto run = FindRun(who.tenant, id)) {
    if (MarkEnded(*run)) {
      StopRun(id, *run);
      ojson cancelled = run->shell;
      cancelled["status"] = "cancelled";
      const std::string text = Dump(cancelled);
      store_->Put({id, run->tenant, run->created_at, "cancelled", std::move(cancelled), ojson::array(), {}},
                  [exchange, text](const Status& st) {
                    if (!st) return ReplyError(*exchange, StoreError(st.error()));
                    ReplyJson(*exchange, 200, text);
                  });
      return;
    }
  }
  auto row = store_->Get(who.tenant, id);
  if (!row) return ReplyError(*exchange, ApiError::FromError(row.error()));
  if (!*row) return ReplyError(*exchange, NotFound(id, false));
  const ojson response = (*row)->status == "in_progress" ? AsInterrupted((*row)->response) : (*row)->response;
  const std::string status = response.value("status", "");
  if (!response.value("background", false)) {
    return ReplyError(*exchange, ApiError::InvalidRequest("Only a background response can be cancelled; '" + id +
                                                          "' was not created with background: true"));
  }
  if (status == "cancelled") return ReplyJson(*exchange, 200, Dump(response));
  return ReplyError(*exchange, ApiError::InvalidRequest("Cannot cancel a response that is " + status +
                                                        "; only a queued or in-progress one can be cancelled"));
}

}  // namespace moeserve::daemon
