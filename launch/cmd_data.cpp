// `gmod data check DATA --images DIR --tokenizer T ...`: validate a dataset before a long job.
// `gmod data demo --out DIR [--train N] [--heldout N] [--image-size S] [--seed S]`: write the shapes demo set.
#include <iostream>

#include "data/check.h"
#include "data/demo_dataset.h"
#include "launch/args.h"

namespace gmod::cli {
namespace {

int run_data(const std::vector<std::string>& argv) {
  if (argv.empty() || (argv[0] != "check" && argv[0] != "demo")) {
    std::cerr << "usage: gmod data check DATA --images DIR --tokenizer T [--template vicuna_v1|plain|chatml]\n"
                 "                       [--max-len N] [--image-tokens N] [--image-token-id ID]\n"
                 "       gmod data demo --out DIR [--train N] [--heldout N] [--image-size S] [--seed S]\n";
    return 2;
  }
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (argv[0] == "check") return run_data_check(rest, std::cout, std::cerr);
  Args a(rest);
  a.check_known({"out", "train", "heldout", "image-size", "seed"});
  auto out = a.get("out");
  if (!out) throw std::invalid_argument("--out DIR is required");
  DemoDatasetOptions o;
  o.num_train = std::stoi(a.get_or("train", std::to_string(o.num_train)));
  o.num_heldout = std::stoi(a.get_or("heldout", std::to_string(o.num_heldout)));
  o.image_size = std::stoi(a.get_or("image-size", std::to_string(o.image_size)));
  o.seed = std::stoull(a.get_or("seed", std::to_string(o.seed)));
  make_demo_dataset(*out, o);
  std::cout << "wrote " << o.num_train << " train and " << o.num_heldout << " held-out records to " << *out << "\n";
  return 0;
}

Register reg({"data", "validate a dataset (check) or write the demo dataset (demo)", run_data});

}  // namespace
}  // namespace gmod::cli
