// Whole-dataset validation and its command-line front end.
#include "data/check.h"

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <thread>

namespace gmod {

DataCheckReport check_dataset(const DataCheckOptions& o) {
  DatasetConfig dc;
  dc.data_path = o.data;
  dc.image_folder = o.images;
  dc.conversation.template_name = o.template_name;
  dc.conversation.image_seq_length = o.image_tokens;
  dc.conversation.image_token_id = o.image_token_id;
  dc.conversation.image_first = o.image_first;
  dc.sample.max_len = o.max_len;
  dc.sample.truncation = parse_truncation_mode(o.truncation);
  dc.max_image_pixels = o.max_image_pixels;
  std::shared_ptr<const Tokenizer> tok = load_tokenizer(o.tokenizer);
  Dataset ds(dc, tok);

  const size_t n = ds.size();
  struct Result {
    bool ok = false, truncated = false;
    int64_t tokens = 0;
    BadRecord bad;
  };
  std::vector<Result> results(n);
  const int workers = std::max(1, o.workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (size_t i = static_cast<size_t>(w); i < n; i += static_cast<size_t>(workers)) {
        PreparedSample s;
        Result& r = results[i];
        r.ok = ds.try_prepare(i, s, r.bad, o.decode_images);
        if (r.ok) {
          r.truncated = s.sample.truncated;
          r.tokens = static_cast<int64_t>(s.sample.ids.size());
        }
      }
    });
  }
  for (auto& t : threads) t.join();

  DataCheckReport rep;
  rep.records = n;
  for (auto& r : results) {
    if (r.ok) {
      ++rep.ok;
      rep.truncated += r.truncated;
      rep.tokens += r.tokens;
    } else {
      ++rep.by_reason[r.bad.reason];
      rep.problems.push_back(std::move(r.bad));
    }
  }
  return rep;
}

namespace {

const char* kUsage =
    "usage: gmod data check DATA --images DIR --tokenizer T [--template vicuna_v1|plain|chatml] [--max-len "
    "N]\n"
    "                       [--image-tokens N] [--image-token-id ID] [--truncation turn|skip] "
    "[--no-image-first]\n"
    "                       [--no-decode] [--max-image-pixels N] [--workers N]\n";

}  // namespace

int run_data_check(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  DataCheckOptions o;
  try {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      auto value = [&]() -> const std::string& {
        if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value");
        return args[++i];
      };
      auto long_value = [&]() -> int64_t {
        const std::string& v = value();
        size_t used = 0;
        long long x = 0;
        try {
          x = std::stoll(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != v.size()) throw std::invalid_argument(a + ": not an integer: " + v);
        return x;
      };
      auto int_value = [&]() {
        const int64_t x = long_value();
        if (x < INT32_MIN || x > INT32_MAX) throw std::invalid_argument(a + ": " + std::to_string(x) + " is out of range");
        return int(x);
      };
      if (a == "--help" || a == "-h") {
        out << kUsage;
        return 0;
      } else if (a == "--images") {
        o.images = value();
      } else if (a == "--tokenizer") {
        o.tokenizer = value();
      } else if (a == "--template") {
        o.template_name = value();
      } else if (a == "--max-len") {
        o.max_len = int_value();
      } else if (a == "--image-tokens") {
        o.image_tokens = int_value();
      } else if (a == "--image-token-id") {
        o.image_token_id = int_value();
      } else if (a == "--truncation") {
        o.truncation = value();
      } else if (a == "--workers") {
        o.workers = int_value();
      } else if (a == "--max-image-pixels") {
        o.max_image_pixels = long_value();
        if (o.max_image_pixels < 1) throw std::invalid_argument("--max-image-pixels must be >= 1");
      } else if (a == "--no-decode") {
        o.decode_images = false;
      } else if (a == "--no-image-first") {
        o.image_first = false;
      } else if (!a.empty() && a[0] == '-') {
        throw std::invalid_argument("unknown option " + a);
      } else if (o.data.empty()) {
        o.data = a;
      } else {
        throw std::invalid_argument("unexpected argument " + a);
      }
    }
    if (o.data.empty()) throw std::invalid_argument("missing DATA");
    if (o.tokenizer.empty()) throw std::invalid_argument("missing --tokenizer");
  } catch (const std::exception& e) {
    err << "gmod data check: " << e.what() << "\n" << kUsage;
    return 2;
  }
  DataCheckReport rep;
  try {
    rep = check_dataset(o);
  } catch (const std::exception& e) {
    err << "gmod data check: " << e.what() << "\n";
    return 2;
  }
  if (rep.records == 0) {
    out << o.data << ": no records (an empty dataset); nothing to train on\n";
    return 1;
  }
  for (const auto& p : rep.problems) out << "problem [" << p.reason << "] " << p.message << "\n";
  out << o.data << ": " << rep.records << " records, " << rep.ok << " usable, " << rep.problems.size()
      << " with problems";
  if (!rep.by_reason.empty()) {
    out << " (";
    bool first = true;
    for (const auto& [reason, count] : rep.by_reason) {
      out << (first ? "" : ", ") << reason << ": " << count;
      first = false;
    }
    out << ")";
  }
  out << "; " << rep.truncated << " truncated to --max-len " << o.max_len << "; " << rep.tokens
      << " tokens (images expanded)\n";
  return rep.problems.empty() ? 0 : 1;
}

}  // namespace gmod
