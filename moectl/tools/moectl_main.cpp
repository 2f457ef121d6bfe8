// moectl: a command line for SREs over moeserve's budgets (moectl --help).
#include <iostream>
#include <string>
#include <vector>

#include "moeserve/moectl/cli.hpp"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return moeserve::moectl::RunMoectl(args, std::cout, std::cerr);
}
