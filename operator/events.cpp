#include "moeserve/operator/events.hpp"

#include <atomic>
#include <chrono>
#include <ctime>

#include "moeserve/common/log.hpp"
#include "moeserve/common/rfc3339.hpp"

namespace moeserve::op {

void EventRecorder::Record(const json& object, const std::string& type, const std::string& reason,
                           const std::string& message) {
  const json& m = object["metadata"];
  const std::string now = NowRfc3339();
  json event = {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata", {{"generateName", m.value("name", "object") + "."}, {"namespace", m.value("namespace", "default")}}},
      {"involvedObject",
       {{"apiVersion", object.value("apiVersion", "")},
        {"kind", object.value("kind", "")},
        {"name", m.value("name", "")},
        {"namespace", m.value("namespace", "")},
        {"uid", m.value("uid", "")},
        {"resourceVersion", m.value("resourceVersion", "")}}},
      {"type", type},
      {"reason", reason},
      {"message", message},
      {"source", {{"component", component_}}},
      {"reportingComponent", component_},
      {"firstTimestamp", now},
      {"lastTimestamp", now},
      {"count", 1}};
  auto created = client_.Create(resources::kEvent, m.value("namespace", "default"), event);
  if (!created) log::Warn("event " + reason + " for " + m.value("name", "") + ": " + created.error().ToString());
}

}  // namespace moeserve::op
