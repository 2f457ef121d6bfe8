// moe-fake-apiserver: the Kubernetes API double as a process, for driving it
// with kubectl by hand, and with --run-pods the pod runner (pod_runner.hpp):
// StatefulSets' pods run as local processes, Services get Endpoints.
//
//   moe-fake-apiserver [--port N] [--crds DIR_OR_FILE]... [--kubeconfig PATH]
//                      [--run-pods ROOT] [--image IMAGE=EXECUTABLE]...
//                      [--endpoints NAMESPACE/SERVICE=PORT]...
//
// Prints its URL on stdout when it listens. --image maps an image ("repo" for
// any tag, or "repo:tag") to the local program its containers run;
// --endpoints points a Service at a port on 127.0.0.1 instead of at pods (a
// process run beside the cluster, e.g. moe-operator's webhook).
#include <csignal>
#include <filesystem>
#include <iostream>
#include <thread>

#include "fake_apiserver.hpp"
#include "pod_runner.hpp"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

int Usage(const std::string& why) {
  if (!why.empty()) std::cerr << "moe-fake-apiserver: " << why << "\n";
  std::cerr << "usage: moe-fake-apiserver [--port N] [--crds DIR_OR_FILE]... [--kubeconfig PATH]\n"
               "                          [--run-pods ROOT] [--image IMAGE=EXECUTABLE]... "
               "[--endpoints NAMESPACE/SERVICE=PORT]...\n";
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  int port = 0;
  std::vector<std::string> crds;
  std::string kubeconfig;
  moeserve::fakes::PodRunnerOptions runner;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--port") port = std::stoi(next());
    else if (a == "--crds") crds.push_back(next());
    else if (a == "--kubeconfig") kubeconfig = next();
    else if (a == "--run-pods") runner.root = std::filesystem::absolute(next()).lexically_normal().string();
    else if (a == "--image" || a == "--endpoints") {
      const std::string v = next();
      const auto eq = v.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == v.size()) return Usage(a + " takes KEY=VALUE, not \"" + v + "\"");
      if (a == "--image") {
        runner.images[v.substr(0, eq)] = std::filesystem::absolute(v.substr(eq + 1)).string();
      } else {
        try {
          runner.external_endpoints[v.substr(0, eq)].push_back(std::stoi(v.substr(eq + 1)));
        } catch (...) {
          return Usage("--endpoints " + v + ": the port is not a number");
        }
      }
    } else {
      return Usage("unknown argument " + a);
    }
  }
  if (runner.root.empty() && (!runner.images.empty() || !runner.external_endpoints.empty()))
    return Usage("--image and --endpoints need --run-pods ROOT");
  moeserve::fakes::FakeApiServer server;
  for (const auto& c : crds) {
    std::vector<std::string> files;
    if (std::filesystem::is_directory(c)) {
      for (const auto& e : std::filesystem::directory_iterator(c))
        if (e.path().extension() == ".yaml") files.push_back(e.path());
    } else {
      files.push_back(c);
    }
    for (const auto& f : files) {
      auto s = server.RegisterCrdFile(f);
      if (!s) {
        std::cerr << "moe-fake-apiserver: " << s.error().ToString() << "\n";
        return 1;
      }
    }
  }
  if (server.Start(port) < 0) {
    std::cerr << "moe-fake-apiserver: cannot listen on 127.0.0.1:" << port << "\n";
    return 1;
  }
  std::unique_ptr<moeserve::fakes::PodRunner> pods;
  if (!runner.root.empty()) {
    pods = std::make_unique<moeserve::fakes::PodRunner>(server, runner);
    if (auto s = pods->Start(); !s) {
      std::cerr << "moe-fake-apiserver: " << s.error().ToString() << "\n";
      return 1;
    }
  }
  if (!kubeconfig.empty()) (void)server.WriteKubeconfig(kubeconfig);
  std::cout << server.url() << std::endl;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (pods) pods->Stop();  // every container stopped before the server goes
  server.Stop();
  return 0;
}
