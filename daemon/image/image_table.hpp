// The tables that keep conversations' images once (stored_images.hpp), in
// the sessions' SQLite database: `images` holds each encoded file once per
// tenant and content hash; `image_refs` says which session entry or stored
// response uses which, and where. An image no reference names any more is
// deleted in the same transaction as the last reference (a deleted or
// expired session, a deleted response).
//
// Every read names the tenant, and a file is keyed by (tenant, hash): two
// tenants sending the same picture each store their own copy, and no
// tenant's conversation can load another's file whatever hash it names.
//
// Thread safety: functions over a connection the caller holds (the session
// store's writer thread, or SessionStore::Read).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/daemon/image/stored_images.hpp"

namespace moeserve::daemon {

// CREATE TABLE IF NOT EXISTS statements for both tables.
extern const char* const kImageSchema;

// Where an image sits: for a session, the entry (seq) and the order among
// its images; for a stored response, seq 0 and its order in the conversation.
struct ImageRef {
  int64_t seq = 0;
  int64_t ord = 0;
  int64_t at = 0;  // byte offset in the entry's text
  std::string hash;
  uint32_t width = 0, height = 0;
  int64_t span_tokens = 0;
};

// Inserts the files the tenant does not hold yet (by hash); the others are left as they are.
Status PutImageFiles(sqlite3* db, const std::string& tenant, const std::vector<StoredImageFile>& files);
Status AddImageRefs(sqlite3* db, const std::string& owner, const std::string& tenant, const std::vector<ImageRef>& refs);
// Drops every reference `owner` (a session or response id) holds, then the
// files no reference names any more.
Status DropImageRefs(sqlite3* db, const std::string& owner);
// Deletes the files no reference names (after sessions were deleted in bulk).
Status CollectUnreferencedImages(sqlite3* db);

Result<std::vector<ImageRef>> ImageRefsOf(sqlite3* db, const std::string& owner);
// The tenant's files for `hashes`; a hash the tenant does not hold is missing from the answer.
Result<std::vector<StoredImageFile>> LoadImageFiles(sqlite3* db, const std::string& tenant,
                                                    const std::vector<std::string>& hashes);
// Encoded bytes of the distinct files `owner` refers to.
Result<int64_t> OwnerImageBytes(sqlite3* db, const std::string& owner);
// Files stored over all tenants (tests, metrics).
Result<int64_t> ImageFileCount(sqlite3* db);

// Encoded bytes of the files stored responses keep (responses/response_store.hpp),
// each file once however many responses name it: a continuation names the
// files of the response it continues, and they stay while it does, so they
// count for as long as any response names them. `tenant` null: every
// tenant's, leaving out the files a session also names (a session's bytes
// already count those). Nothing stored (no responses table yet): 0.
Result<int64_t> ResponseImageBytes(sqlite3* db, const std::string* tenant);

}  // namespace moeserve::daemon
