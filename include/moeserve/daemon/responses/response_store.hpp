// Stored responses of POST /v1/responses (store: true, the default): one row
// per response in the sessions' SQLite database, written through the session
// store's group-commit writer (session_store.hpp), so a response the client
// saw acknowledged is on disk.
//
// Every read and delete names the tenant: a row of another tenant is not
// found, exactly as a missing one (the caller answers both with the same 404).
//
// A row keeps the response object as the API returns it and the conversation
// up to and including its output, as chat messages (what a later request
// with previous_response_id continues from). Images in the conversation are
// named by content hash and kept apart, once per tenant (image_table.hpp);
// deleting the last row that names one deletes it.
//
// Thread safety: every method may be called from any thread; `done` runs on
// the writer thread.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"
#include "moeserve/daemon/sessions/session_store.hpp"

namespace moeserve::daemon {

struct StoredResponse {
  std::string id;
  std::string tenant;
  double created_at = 0;               // unix seconds
  std::string status;                  // the response object's status
  nlohmann::ordered_json response;     // the object GET returns
  nlohmann::ordered_json conversation; // chat messages, instructions excluded
  // The image files the conversation names (stored_images.hpp): kept once
  // per tenant and hash, referenced by this row until it is deleted. They
  // count against the quotas once per tenant while any row names them.
  std::vector<StoredImageFile> images;
};

class ResponseStore {
 public:
  // Creates the table in `sessions`' database. `tenant_quota_bytes` bounds
  // what one tenant's stored responses take; `total_quota_bytes` what the
  // sessions and the responses of every tenant take together (the sessions'
  // global cap, which leaves the usage ledger room on the volume).
  static Result<std::unique_ptr<ResponseStore>> Open(SessionStore& sessions, int64_t tenant_quota_bytes,
                                                     int64_t total_quota_bytes);

  using Done = SessionStore::Done;
  // Inserts or replaces the row (a background response moves from
  // in_progress to its end). Fails with ResourceExhausted past the tenant's
  // quota, OutOfRange past the global cap, and stores nothing then. Both
  // count every byte kept: the rows, and each image file any row names (a
  // continuation's, which the response it continues sent, included) once.
  void Put(StoredResponse r, Done done);
  // Fails with NotFound when the tenant has no such response.
  void Delete(std::string tenant, std::string id, Done done);
  Result<std::optional<StoredResponse>> Get(const std::string& tenant, const std::string& id) const;
  // The tenant's image files for `hashes`; a hash it does not hold is left out.
  Result<std::vector<StoredImageFile>> ImageFiles(const std::string& tenant, const std::vector<std::string>& hashes) const {
    return sessions_.ImageFiles(tenant, hashes);
  }

 private:
  ResponseStore(SessionStore& sessions, int64_t quota, int64_t total)
      : sessions_(sessions), quota_(quota), total_(total) {}
  SessionStore& sessions_;
  int64_t quota_;
  int64_t total_;
};

}  // namespace moeserve::daemon
