// moe-fake-apiserver: the Kubernetes API double as a process, for driving it
// with kubectl by hand. Prints the port, writes a kubeconfig if asked.
//
//   moe-fake-apiserver [--port N] [--crds DIR_OR_FILE]... [--kubeconfig PATH]
#include <csignal>
#include <filesystem>
#include <iostream>
#include <thread>

#include "fake_apiserver.hpp"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }
}  // namespace

int main(int argc, char** argv) {
  int port = 0;
  std::vector<std::string> crds;
  std::string kubeconfig;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--port") port = std::stoi(next());
    else if (a == "--crds") crds.push_back(next());
    else if (a == "--kubeconfig") kubeconfig = next();
    else {
      std::cerr << "usage: moe-fake-apiserver [--port N] [--crds DIR_OR_FILE]... [--kubeconfig PATH]\n";
      return 2;
    }
  }
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
  if (!kubeconfig.empty()) (void)server.WriteKubeconfig(kubeconfig);
  std::cout << server.url() << std::endl;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server.Stop();
  return 0;
}
