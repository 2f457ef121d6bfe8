// An S3 server double that lists whatever keys a test gives it, such as keys
// no honest store would hold ("prefix/../../x"), which s3rver cannot store
// because it keeps objects as files. It speaks the two requests a pull without
// a manifest makes: ListObjectsV2 (GET /bucket?list-type=2&prefix=...) and
// GET /bucket/key. manifest.json is always 404 NoSuchKey, so the puller lists.
// An object GET is answered with the body of the listed key whose last
// segment matches the request's (curl folds "../" out of request paths, so
// the raw key cannot be matched), and counted, so a test can tell whether
// the puller fetched anything.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include "test_servers.hpp"

namespace moeserve::testing {

class S3ListingDouble {
 public:
  // objects: full keys (prefix included) -> bodies.
  S3ListingDouble(std::string bucket, std::map<std::string, std::string> objects)
      : bucket_(std::move(bucket)), objects_(std::move(objects)), server_([this](int fd) { Serve(fd); }) {}
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(server_.port()); }
  int object_gets() const { return object_gets_.load(); }
  int lists() const { return lists_.load(); }

 private:
  static std::string XmlEscape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '&') out += "&amp;";
      else if (c == '<') out += "&lt;";
      else if (c == '>') out += "&gt;";
      else out += c;
    }
    return out;
  }

  static bool Send(int fd, const std::string& status, const std::string& body) {
    std::string resp = "HTTP/1.1 " + status + "\r\nContent-Length: " + std::to_string(body.size()) +
                       "\r\nContent-Type: application/xml\r\n\r\n" + body;
    return SendAll(fd, resp.data(), resp.size());
  }

  std::string ListBody() const {
    std::ostringstream xml;
    xml << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult><Name>" << bucket_
        << "</Name><IsTruncated>false</IsTruncated>";
    for (const auto& [key, body] : objects_)
      xml << "<Contents><Key>" << XmlEscape(key) << "</Key><Size>" << body.size() << "</Size></Contents>";
    xml << "</ListBucketResult>";
    return xml.str();
  }

  void Serve(int fd) {
    std::string buffer, head;
    while (ReadRequestHead(fd, buffer, head)) {
      std::istringstream first(head);
      std::string method, target;
      first >> method >> target;
      std::string path = UrlDecode(target.substr(0, target.find('?')));
      bool ok = true;
      if (target.find("list-type=2") != std::string::npos) {
        lists_++;
        ok = Send(fd, "200 OK", ListBody());
      } else if (path.ends_with("/manifest.json")) {
        ok = Send(fd, "404 Not Found",
                  "<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>");
      } else {
        object_gets_++;
        std::string last = path.substr(path.rfind('/') + 1);
        const std::string* found = nullptr;
        for (const auto& [key, body] : objects_)
          if (key.substr(key.rfind('/') + 1) == last) found = &body;
        ok = found ? Send(fd, "200 OK", *found)
                   : Send(fd, "404 Not Found", "<Error><Code>NoSuchKey</Code><Message>no</Message></Error>");
      }
      if (!ok) return;
    }
  }

  std::string bucket_;
  std::map<std::string, std::string> objects_;
  std::atomic<int> object_gets_{0};
  std::atomic<int> lists_{0};
  TcpServer server_;  // last: its threads use the members above
};

}  // namespace moeserve::testing
