// The HTTP ceiling for bench/daemon: a trivial cpprestsdk http_listener that
// answers every POST with a fixed chat.completion JSON body. The daemon's
// requests/s at max_tokens 1 is read against this number.
// Build: g++ -std=c++2b -O2 http_ceiling.cpp -o http_ceiling -lcpprest -lssl -lcrypto -lpthread
#include <cpprest/http_listener.h>

#include <csignal>
#include <iostream>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: http_ceiling PORT\n";
    return 2;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  const std::string body =
      R"({"id":"chatcmpl-x","object":"chat.completion","created":0,"model":"tiny","choices":[{"index":0,)"
      R"("message":{"role":"assistant","content":"a"},"finish_reason":"length"}],)"
      R"("usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8}})";
  web::http::experimental::listener::http_listener listener("http://127.0.0.1:" + std::string(argv[1]));
  listener.support([&](web::http::http_request request) {
    request.extract_vector().then([request, &body](pplx::task<std::vector<unsigned char>>) mutable {
      web::http::http_response response(web::http::status_codes::OK);
      response.set_body(body, "application/json");
      request.reply(response);
    });
  });
  listener.open().wait();
  std::cerr << "http_ceiling: listening on " << argv[1] << "\n";
  int sig = 0;
  sigwait(&signals, &sig);
  listener.close().wait();
  return 0;
}
