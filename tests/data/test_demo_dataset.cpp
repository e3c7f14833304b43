// Synthetic demo dataset: determinism, LLaVA-format validity, answers re-derived from the pixels and the
// recorded scenes, disjoint held-out images.
#include <ftw.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

#include "data/demo_dataset.h"
#include "data/image.h"

namespace {

using nlohmann::json;

// Not std::filesystem::remove_all: libtorch.so exports a broken copy of it (see test_image.cpp).
void remove_tree(const std::string& d) {
  ::nftw(d.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
}

std::string temp_dir(const std::string& tag) {
  return "/tmp/gmod_test_demo_" + std::to_string(::getpid()) + "_" + tag;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

json load(const std::string& path) { return json::parse(slurp(path)); }

size_t count_of(const std::string& s, const std::string& sub) {
  size_t n = 0;
  for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + 1)) ++n;
  return n;
}

std::string cap(std::string s) {
  s[0] = static_cast<char>(std::toupper(s[0]));
  return s;
}

// Re-derives the answer to an image question from the recorded scene; "" if the question is unknown.
std::string answer_from_scene(const std::string& q, const json& scene, int size) {
  std::smatch m;
  const auto& shapes = scene["shapes"];
  auto find = [&](const std::string& key, const std::string& val) {
    std::vector<json> out;
    for (const auto& s : shapes)
      if (s[key] == val) out.push_back(s);
    return out;
  };
  if (std::regex_match(q, m, std::regex("What colour is the (\\w+)\\?"))) {
    auto v = find("shape", m[1]);
    EXPECT_EQ(v.size(), 1u) << "ambiguous: " << q;
    return v.empty() ? "?" : cap(v[0]["colour"]);
  }
  if (std::regex_match(q, m, std::regex("What shape is the (\\w+) object\\?"))) {
    auto v = find("colour", m[1]);
    EXPECT_EQ(v.size(), 1u) << "ambiguous: " << q;
    return v.empty() ? "?" : cap(v[0]["shape"]);
  }
  if (q == "How many shapes are there?") return std::to_string(shapes.size());
  if (std::regex_match(q, m, std::regex("How many (\\w+)s are there\\?"))) return std::to_string(find("shape", m[1]).size());
  if (std::regex_match(q, m, std::regex("Is the (\\w+) (\\w+) (on the left or the right|at the top or the bottom)\\?"))) {
    auto v = find("colour", m[1]);
    EXPECT_EQ(v.size(), 1u) << q;
    if (v.empty()) return "?";
    EXPECT_EQ(v[0]["shape"], m[2].str()) << q;
    if (m[3].str()[0] == 'o') return v[0]["cx"].get<int>() < size / 2 ? "Left" : "Right";
    return v[0]["cy"].get<int>() < size / 2 ? "Top" : "Bottom";
  }
  return "";
}

std::string answer_text(const std::string& q) {
  std::smatch m;
  if (std::regex_match(q, m, std::regex("What is (\\d+) (plus|minus|times) (\\d+)\\?"))) {
    const int a = std::stoi(m[1]), b = std::stoi(m[3]);
    return std::to_string(m[2] == "plus" ? a + b : m[2] == "minus" ? a - b : a * b);
  }
  if (std::regex_match(q, m, std::regex("What colour do you get by mixing (\\w+) and (\\w+)\\?"))) {
    const std::map<std::set<std::string>, std::string> mix = {{{"red", "yellow"}, "Orange"}, {{"blue", "yellow"}, "Green"},
                                                              {{"red", "blue"}, "Purple"},   {{"red", "white"}, "Pink"},
                                                              {{"black", "white"}, "Grey"}};
    auto it = mix.find({m[1], m[2]});
    return it == mix.end() ? "?" : it->second;
  }
  return "";
}

// Checks the rendered pixels against the scene: each shape's colour occurs only inside its quadrant
// (so positions are unambiguous), the centre pixel has that colour, and no other colours occur.
void check_pixels(const gmod::Image& im, const json& scene, const std::string& where) {
  std::map<std::array<uint8_t, 3>, json> by_rgb;
  for (const auto& s : scene["shapes"]) by_rgb[s["rgb"].get<std::array<uint8_t, 3>>()] = s;
  const auto bg = scene["background"].get<std::array<uint8_t, 3>>();
  std::set<std::array<uint8_t, 3>> seen;
  const int half = im.width / 2;
  for (int y = 0; y < im.height; ++y)
    for (int x = 0; x < im.width; ++x) {
      const uint8_t* p = im.pixel(x, y);
      const std::array<uint8_t, 3> c = {p[0], p[1], p[2]};
      if (c == bg) continue;
      auto it = by_rgb.find(c);
      ASSERT_NE(it, by_rgb.end()) << where << ": unexpected colour at " << x << "," << y;
      seen.insert(c);
      const int cx = it->second["cx"], cy = it->second["cy"];
      ASSERT_EQ(x < half, cx < half) << where << ": shape crosses the vertical midline";
      ASSERT_EQ(y < half, cy < half) << where << ": shape crosses the horizontal midline";
    }
  EXPECT_EQ(seen.size(), scene["shapes"].size()) << where << ": a shape is invisible";
  for (const auto& s : scene["shapes"]) {
    const uint8_t* p = im.pixel(s["cx"], s["cy"]);
    const std::array<uint8_t, 3> centre = {p[0], p[1], p[2]}, want = s["rgb"].get<std::array<uint8_t, 3>>();
    EXPECT_EQ(centre, want) << where;
  }
}

}  // namespace

TEST(DemoDataset, SameSeedGivesByteIdenticalOutput) {
  gmod::DemoDatasetOptions o;
  o.num_train = 60;
  o.num_heldout = 20;
  o.seed = 7;
  const std::string a = temp_dir("a"), b = temp_dir("b"), c = temp_dir("c");
  gmod::make_demo_dataset(a, o);
  gmod::make_demo_dataset(b, o);
  for (const char* f : {"train.json", "heldout.json", "train.jsonl", "scenes.json"})
    EXPECT_EQ(slurp(a + "/" + f), slurp(b + "/" + f)) << f;
  size_t images = 0;
  const json scenes = load(a + "/scenes.json");
  for (const auto& item : scenes.items()) {
    const std::string rel = item.key();
    EXPECT_EQ(slurp(a + "/" + rel), slurp(b + "/" + rel)) << rel;
    ++images;
  }
  EXPECT_GT(images, 40u);
  o.seed = 8;
  gmod::make_demo_dataset(c, o);
  EXPECT_NE(slurp(a + "/train.json"), slurp(c + "/train.json"));
  for (const auto& d : {a, b, c}) remove_tree(d);
}

TEST(DemoDataset, RecordsAreValidAndAnswersConsistent) {
  gmod::DemoDatasetOptions o;  // defaults
  const std::string dir = temp_dir("v");
  const auto t0 = std::chrono::steady_clock::now();
  gmod::make_demo_dataset(dir, o);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ info ] make_demo_dataset: %d train + %d heldout records, %dx%d images, %.3f s\n", o.num_train,
              o.num_heldout, o.image_size, o.image_size, secs);
  EXPECT_LT(secs, 30.0);

  const json scenes = load(dir + "/scenes.json");
  const json train = load(dir + "/train.json"), heldout = load(dir + "/heldout.json");
  ASSERT_EQ(train.size(), size_t(o.num_train));
  ASSERT_EQ(heldout.size(), size_t(o.num_heldout));

  std::set<std::string> ids, train_images, heldout_images;
  int text_only = 0, multi_turn = 0, turns_checked = 0;
  std::map<std::string, int> answers;
  for (const json* split : {&train, &heldout}) {
    for (const auto& r : *split) {
      const std::string id = r["id"];
      SCOPED_TRACE(id);
      EXPECT_TRUE(ids.insert(id).second) << "duplicate id";
      const auto& conv = r["conversations"];
      ASSERT_TRUE(conv.is_array());
      ASSERT_GE(conv.size(), 2u);
      ASSERT_EQ(conv.size() % 2, 0u);
      const bool has_image = r.contains("image");
      size_t image_tags = 0;
      for (size_t t = 0; t < conv.size(); ++t) {
        EXPECT_EQ(conv[t]["from"], t % 2 == 0 ? "human" : "gpt");
        image_tags += count_of(conv[t]["value"].get<std::string>(), "<image>");
      }
      EXPECT_EQ(image_tags, has_image ? 1u : 0u);
      if (has_image) {
        EXPECT_EQ(conv[0]["value"].get<std::string>().rfind("<image>\n", 0), 0u);
      }
      multi_turn += conv.size() > 2;
      std::string rel;
      if (has_image) {
        rel = r["image"];
        (split == &train ? train_images : heldout_images).insert(rel);
        ASSERT_TRUE(scenes.contains(rel)) << rel;
        const gmod::Image im = gmod::decode_image_file(dir + "/" + rel);
        ASSERT_EQ(im.width, o.image_size);
        ASSERT_EQ(im.height, o.image_size);
        check_pixels(im, scenes[rel], rel);
      } else {
        ++text_only;
      }
      for (size_t t = 0; t < conv.size(); t += 2) {
        std::string q = conv[t]["value"];
        if (t == 0 && has_image) q = q.substr(8);
        const std::string want = has_image ? answer_from_scene(q, scenes[rel], o.image_size) : answer_text(q);
        ASSERT_FALSE(want.empty()) << "question not recognised: " << q;
        EXPECT_EQ(conv[t + 1]["value"].get<std::string>(), want) << q;
        answers[conv[t + 1]["value"]]++;
        ++turns_checked;
      }
    }
  }
  std::printf("[ info ] %d turns checked, %d text-only, %d multi-turn records, %zu distinct answers\n", turns_checked,
              text_only, multi_turn, answers.size());
  EXPECT_GT(text_only, 0);
  EXPECT_GT(multi_turn, 0);
  for (const char* a : {"Red", "Circle", "Left", "Bottom", "2"}) EXPECT_GT(answers[a], 0) << a;
  for (const auto& h : heldout_images) EXPECT_EQ(train_images.count(h), 0u) << h;
  EXPECT_EQ(train_images.size() + heldout_images.size(), scenes.size());

  // train.jsonl holds the same records, one per line.
  std::ifstream jl(dir + "/train.jsonl");
  std::string line;
  size_t n = 0;
  while (std::getline(jl, line)) {
    ASSERT_LT(n, train.size());
    EXPECT_EQ(json::parse(line), train[n]) << "line " << n;
    ++n;
  }
  EXPECT_EQ(n, train.size());
  remove_tree(dir);
}

TEST(DemoDataset, OptionsAreHonouredAndValidated) {
  gmod::DemoDatasetOptions o;
  o.num_train = 5;
  o.num_heldout = 3;
  o.image_size = 96;
  o.text_only_fraction = 0.0;
  o.multi_turn_fraction = 1.0;
  const std::string dir = temp_dir("o");
  gmod::make_demo_dataset(dir, o);
  const json train = load(dir + "/train.json");
  ASSERT_EQ(train.size(), 5u);
  for (const auto& r : train) {
    ASSERT_TRUE(r.contains("image"));
    EXPECT_GE(r["conversations"].size(), 4u);
    EXPECT_EQ(gmod::decode_image_file(dir + "/" + r["image"].get<std::string>()).width, 96);
  }
  EXPECT_EQ(load(dir + "/heldout.json").size(), 3u);
  o.image_size = 8;
  EXPECT_THROW(gmod::make_demo_dataset(dir, o), std::runtime_error);
  remove_tree(dir);
}
