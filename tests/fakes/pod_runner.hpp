// PodRunner: the StatefulSet controller, scheduler, kubelet and endpoints
// controller of a one-node cluster around the API double, with local
// processes for containers. It lets the operator's own StatefulSets start
// real moe-daemon processes from their pod specs, so that `kubectl apply` of
// a MoEDeployment ends in an endpoint that answers (scripts/demo, and the
// tests/e2e front-door tests). Test and demo tooling, not product: it lives
// beside the API double it drives (in-process, through FakeApiServer's
// direct-access methods and its webhook Service map).
//
// What it does, as the real components would:
// - StatefulSets (any namespace): pods <name>-<ordinal> for each ordinal
//   below spec.replicas from the template (labels apps.kubernetes.io/pod-index,
//   statefulset.kubernetes.io/pod-name, controller-revision-hash; an owner
//   reference; claims of volumeClaimTemplates), pods past it deleted, OnDelete
//   updates (a pod of an old template runs until someone deletes it), and
//   status (replicas, readyReplicas, currentReplicas, updatedReplicas,
//   current/updateRevision, observedGeneration).
// - Pods of StatefulSets (others are left alone): scheduled onto the one node
//   "local" unless they ask for what it lacks (a nodeSelector it does not
//   match, an extended resource such as nvidia.com/gpu): then Pending with
//   PodScheduled=False and the scheduler's message. Init containers in order,
//   each to a zero exit (a failure is retried with back-off: Init:Error,
//   Init:CrashLoopBackOff), then every container; restartPolicy Always (exits
//   restart with back-off 1 s doubling to 10 s, restartCount and lastState
//   kept); readiness and liveness probes (httpGet over HTTP or HTTPS without
//   verification, as the kubelet; tcpSocket; exec) with their thresholds;
//   Ready, ContainersReady, Initialized conditions, podIP 127.0.0.1; Events
//   for what it refuses; each container's output kept for `kubectl logs`
//   (and --previous) through FakeApiServer::SetPodLogReader; on deletion,
//   SIGTERM to the container's process group, SIGKILL after the grace period
//   (at most max_grace_seconds).
// - Services with a selector: an Endpoints object of the Ready pods it
//   selects, and the API double's webhook Service map; a Service named in
//   external_endpoints maps to those ports instead (a process run outside,
//   such as moe-operator beside the runner).
//
// Processes. A container runs the local executable its image maps to
// (options.images: "repo:tag" or "repo" -> path), with the container's args
// (a command must name the same program), in the pod's environment (the
// container's env with $(VAR) references expanded, fieldRef, secretKeyRef and
// configMapKeyRef resolved, plus what the kubelet adds: HOSTNAME, PATH,
// KUBERNETES_SERVICE_HOST/PORT). Pods share the machine's network, as on a
// node with hostNetwork: a pod's containerPort must be free on it, or its
// container waits (PortInUse) until it is.
//
// Files. Nothing is written outside options.root. Each pod has
// root/pods/<namespace>/<name>/rootfs standing in for its "/": a volume
// mounted at /etc/moeserve/config is a symbolic link rootfs/etc/moeserve/config
// to the volume's folder (root/pods/.../volumes/<name>, or
// root/claims/<namespace>/<claim> for a PersistentVolumeClaim, which outlives
// the pod as a node's disk does). Since the programs open the paths their
// spec names, every mount path in the container's command, args, env values,
// workingDir and the files of its mounted ConfigMaps is rewritten to the
// same path under rootfs (a path is rewritten where it starts a word:
// "/etc/moeserve/config/config.yaml" -> "<rootfs>/etc/moeserve/config/config.yaml";
// paths that are not under a mount are left as they are). ConfigMap and
// Secret volumes are refreshed while the pod runs, as the kubelet does.
//
// What it cannot honour it refuses, loudly (an Event, the container's
// waiting reason and message, a line on stderr), never running something
// else: hostPath and other volume kinds than configMap, secret, emptyDir and
// persistentVolumeClaim; privileged containers or added capabilities; hostPID
// or hostIPC; an image it maps to no executable (ErrImagePull); a command
// naming another program; gRPC probes; lifecycle hooks; sidecar init
// containers; nested mount paths. Not done: runAsUser/fsGroup (processes run
// as the runner's user), readOnlyRootFilesystem and resource limits (not
// enforced), CPU and memory requests (not counted), Deployments, DaemonSets
// and Jobs (their pods are not made).
//
// Thread safety: Start/Stop from one thread; the log reader is called from
// the API double's threads.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fake_apiserver.hpp"
#include "moeserve/common/status.hpp"

namespace moeserve::fakes {

struct PodRunnerOptions {
  std::string root;                                            // everything the runner writes
  std::map<std::string, std::string> images;                   // image ("repo:tag" or "repo") -> executable
  std::map<std::string, std::vector<int>> external_endpoints;  // "ns/service" -> ports on 127.0.0.1
  std::map<std::string, std::string> node_labels = {{"kubernetes.io/hostname", "local"},
                                                     {"kubernetes.io/os", "linux"},
                                                     {"kubernetes.io/arch", "amd64"}};
  std::chrono::milliseconds tick{200};
  int max_grace_seconds = 10;
};

class PodRunner {
 public:
  PodRunner(FakeApiServer& server, PodRunnerOptions options);
  ~PodRunner();
  PodRunner(const PodRunner&) = delete;
  PodRunner& operator=(const PodRunner&) = delete;

  Status Start();
  // Stops every container (SIGTERM, then SIGKILL after the grace period) and the loop.
  void Stop();

  // The folder standing in for a pod's "/".
  std::string PodRootfs(const std::string& ns, const std::string& name) const;

  struct Pod;

 private:
  void Loop();
  void Tick();
  void ReconcileStatefulSets();
  void SyncPods();
  void SyncEndpoints();
  Result<std::string> ReadLog(const std::string& ns, const std::string& pod, const std::string& container,
                              bool previous);

  FakeApiServer& server_;
  PodRunnerOptions options_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  mutable std::mutex mu_;                              // pods_
  std::map<std::string, std::unique_ptr<Pod>> pods_;  // by uid
  std::map<std::string, std::string> endpoints_written_;  // "ns/name" -> subsets dump
};

}  // namespace moeserve::fakes
