// Synthetic shapes dataset in LLaVA format. See demo_dataset.h.
#include "data/demo_dataset.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/image.h"

namespace gmod {
namespace {

using ojson = nlohmann::ordered_json;

// splitmix64: tiny, portable and fully specified (std distributions are not portable across libstdc++s).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int uniform(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1)); }  // [lo, hi]
  double unit() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
};

struct Colour {
  const char* name;
  std::array<uint8_t, 3> rgb;
};
const Colour kColours[] = {{"red", {220, 30, 30}},     {"green", {30, 160, 60}},   {"blue", {30, 70, 220}},
                           {"yellow", {240, 210, 30}}, {"purple", {140, 50, 170}}, {"orange", {245, 140, 20}}};
constexpr int kNumColours = sizeof(kColours) / sizeof(kColours[0]);
const std::array<uint8_t, 3> kBackgrounds[] = {{255, 255, 255}, {205, 205, 205}, {40, 40, 40}};
const char* kShapes[] = {"circle", "square", "triangle"};
const char* kShapesPlural[] = {"circles", "squares", "triangles"};
constexpr int kNumShapes = 3;

struct Shape {
  int kind, colour, cx, cy, r;
};
struct Scene {
  int background;
  std::vector<Shape> shapes;
};

std::string capitalise(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s;
}

// 1-4 shapes, distinct colours, each inside its own quadrant with a margin, so that a shape never
// crosses the vertical or horizontal midline.
Scene make_scene(Rng& rng, int size) {
  Scene sc;
  sc.background = rng.uniform(0, 2);
  const int n = rng.uniform(1, 4);
  int quads[4] = {0, 1, 2, 3}, cols[kNumColours];
  for (int i = 0; i < kNumColours; ++i) cols[i] = i;
  for (int i = 3; i > 0; --i) std::swap(quads[i], quads[rng.uniform(0, i)]);
  for (int i = kNumColours - 1; i > 0; --i) std::swap(cols[i], cols[rng.uniform(0, i)]);
  const int half = size / 2;
  const int rmin = std::max(4, size / 10), rmax = std::max(rmin, size / 6);
  for (int i = 0; i < n; ++i) {
    Shape s;
    s.kind = rng.uniform(0, kNumShapes - 1);
    s.colour = cols[i];
    s.r = rng.uniform(rmin, rmax);
    const int qx = (quads[i] % 2) * half, qy = (quads[i] / 2) * half;
    s.cx = rng.uniform(qx + s.r + 1, qx + half - s.r - 2);
    s.cy = rng.uniform(qy + s.r + 1, qy + half - s.r - 2);
    sc.shapes.push_back(s);
  }
  return sc;
}

bool covers(const Shape& s, double x, double y) {
  const double dx = x - s.cx, dy = y - s.cy;
  switch (s.kind) {
    case 0: return dx * dx + dy * dy <= double(s.r) * s.r;
    case 1: return std::abs(dx) <= 0.8 * s.r && std::abs(dy) <= 0.8 * s.r;
    default: return dy >= -s.r && dy <= s.r && std::abs(dx) <= (dy + s.r) / 2.0;  // apex up
  }
}

Image render(const Scene& sc, int size) {
  Image im;
  im.width = im.height = size;
  im.rgb.resize(static_cast<size_t>(size) * size * 3);
  for (int y = 0; y < size; ++y)
    for (int x = 0; x < size; ++x) {
      std::array<uint8_t, 3> c = kBackgrounds[sc.background];
      for (const auto& s : sc.shapes)
        if (covers(s, x + 0.5, y + 0.5)) c = kColours[s.colour].rgb;
      std::copy(c.begin(), c.end(), im.pixel(x, y));
    }
  return im;
}

using QA = std::pair<std::string, std::string>;

QA image_question(const Scene& sc, Rng& rng, int size) {
  int count[kNumShapes] = {0, 0, 0};
  for (const auto& s : sc.shapes) count[s.kind]++;
  const Shape& s = sc.shapes[rng.uniform(0, static_cast<int>(sc.shapes.size()) - 1)];
  const std::string colour = kColours[s.colour].name, shape = kShapes[s.kind];
  switch (rng.uniform(0, 5)) {
    case 0:
      if (count[s.kind] == 1) return {"What colour is the " + shape + "?", capitalise(colour)};
      [[fallthrough]];
    case 1: return {"What shape is the " + colour + " object?", capitalise(shape)};
    case 2: return {"How many shapes are there?", std::to_string(sc.shapes.size())};
    case 3: {
      const int k = rng.uniform(0, kNumShapes - 1);
      return {std::string("How many ") + kShapesPlural[k] + " are there?", std::to_string(count[k])};
    }
    case 4:
      return {"Is the " + colour + " " + shape + " on the left or the right?", s.cx < size / 2 ? "Left" : "Right"};
    default:
      return {"Is the " + colour + " " + shape + " at the top or the bottom?", s.cy < size / 2 ? "Top" : "Bottom"};
  }
}

QA text_question(Rng& rng) {
  static const char* kMix[][3] = {{"red", "yellow", "Orange"}, {"blue", "yellow", "Green"}, {"red", "blue", "Purple"},
                                  {"red", "white", "Pink"},    {"black", "white", "Grey"}};
  switch (rng.uniform(0, 3)) {
    case 0: {
      const int a = rng.uniform(0, 20), b = rng.uniform(0, 20);
      return {"What is " + std::to_string(a) + " plus " + std::to_string(b) + "?", std::to_string(a + b)};
    }
    case 1: {
      const int a = rng.uniform(0, 20), b = rng.uniform(0, a);
      return {"What is " + std::to_string(a) + " minus " + std::to_string(b) + "?", std::to_string(a - b)};
    }
    case 2: {
      const int a = rng.uniform(0, 10), b = rng.uniform(0, 10);
      return {"What is " + std::to_string(a) + " times " + std::to_string(b) + "?", std::to_string(a * b)};
    }
    default: {
      const auto& m = kMix[rng.uniform(0, 4)];
      const bool swap = rng.uniform(0, 1) == 1;
      return {std::string("What colour do you get by mixing ") + m[swap ? 1 : 0] + " and " + m[swap ? 0 : 1] + "?",
              m[2]};
    }
  }
}

void make_dirs(const std::string& path) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      throw std::runtime_error("make_demo_dataset: cannot create directory '" + cur + "': " + std::strerror(errno));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw std::runtime_error("make_demo_dataset: '" + path + "' is not a directory");
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("make_demo_dataset: cannot open '" + path + "' for writing");
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!f) throw std::runtime_error("make_demo_dataset: write failed for '" + path + "'");
}

// One split: records (and their images, and scene ground truth into `scenes`).
ojson make_split(const std::string& out_dir, const std::string& split, int n, const DemoDatasetOptions& o,
                 uint64_t stream, ojson& scenes) {
  Rng rng(o.seed * 0x9E3779B97F4A7C15ull + stream);
  ojson records = ojson::array();
  for (int i = 0; i < n; ++i) {
    char num[16];
    std::snprintf(num, sizeof(num), "%06d", i);
    ojson rec;
    rec["id"] = "demo-" + split + "-" + num;
    const bool text_only = rng.unit() < o.text_only_fraction;
    const int turns = rng.unit() < o.multi_turn_fraction ? rng.uniform(2, 3) : 1;
    std::vector<QA> qas;
    Scene sc;
    if (!text_only) {
      sc = make_scene(rng, o.image_size);
      const std::string rel = "images/" + split + "_" + num + ".png";
      rec["image"] = rel;
      write_png(out_dir + "/" + rel, render(sc, o.image_size));
      ojson shapes = ojson::array();
      for (const auto& s : sc.shapes) {
        const auto& c = kColours[s.colour];
        shapes.push_back(ojson{{"shape", kShapes[s.kind]}, {"colour", c.name}, {"rgb", c.rgb},
                               {"cx", s.cx}, {"cy", s.cy}, {"r", s.r}});
      }
      scenes[rel] = ojson{{"background", kBackgrounds[sc.background]}, {"shapes", shapes}};
    }
    for (int attempt = 0; static_cast<int>(qas.size()) < turns && attempt < 20; ++attempt) {
      QA qa = text_only ? text_question(rng) : image_question(sc, rng, o.image_size);
      bool dup = false;
      for (const auto& q : qas) dup = dup || q.first == qa.first;
      if (!dup) qas.push_back(qa);
    }
    ojson conv = ojson::array();
    for (size_t t = 0; t < qas.size(); ++t) {
      const std::string q = (t == 0 && !text_only) ? "<image>\n" + qas[t].first : qas[t].first;
      conv.push_back(ojson{{"from", "human"}, {"value", q}});
      conv.push_back(ojson{{"from", "gpt"}, {"value", qas[t].second}});
    }
    rec["conversations"] = conv;
    records.push_back(std::move(rec));
  }
  return records;
}

}  // namespace

void make_demo_dataset(const std::string& out_dir, const DemoDatasetOptions& o) {
  if (o.num_train < 0 || o.num_heldout < 0)
    throw std::runtime_error("make_demo_dataset: record counts must be >= 0");
  if (o.image_size < 32 || o.image_size > 4096)
    throw std::runtime_error("make_demo_dataset: image_size must be in [32, 4096], got " + std::to_string(o.image_size));
  if (!(o.text_only_fraction >= 0 && o.text_only_fraction <= 1 && o.multi_turn_fraction >= 0 &&
        o.multi_turn_fraction <= 1))
    throw std::runtime_error("make_demo_dataset: fractions must be in [0, 1]");
  make_dirs(out_dir + "/images");
  ojson scenes = ojson::object();
  const ojson train = make_split(out_dir, "train", o.num_train, o, 1, scenes);
  const ojson heldout = make_split(out_dir, "heldout", o.num_heldout, o, 2, scenes);
  write_text(out_dir + "/train.json", train.dump(1) + "\n");
  write_text(out_dir + "/heldout.json", heldout.dump(1) + "\n");
  std::string lines;
  for (const auto& r : train) lines += r.dump() + "\n";
  write_text(out_dir + "/train.jsonl", lines);
  write_text(out_dir + "/scenes.json", scenes.dump(1) + "\n");
}

}  // namespace gmod
