// Templates against LLaVA's preprocess_v1 / preprocess_plain (tests/fixtures/conversation/cases.json from
// make_conversation_fixtures.py), token roles, the chatml template, bad records and truncation.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "data/conversation.h"
#include "data/sample.h"
#include "tests/common/paths.h"

using namespace gmod;
using nlohmann::json;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace test_conversation {
namespace {

const json& cases() {
  static const json j = [] {
    std::ifstream f(gmod::test::fixture("conversation/cases.json"));
    return json::parse(f);
  }();
  return j;
}

std::shared_ptr<const Tokenizer> sp_tokenizer() {
  static std::shared_ptr<const Tokenizer> t =
      load_tokenizer(gmod::test::fixture("tokenizer/sp/tokenizer.model"));
  return t;
}

ConversationEncoder encoder(const std::string& tmpl, bool image_first = true) {
  ConversationConfig c;
  c.template_name = tmpl;
  c.image_seq_length = cases()["image_seq_length"];
  c.image_token_id = cases()["image_token_id"];
  c.image_first = image_first;
  return ConversationEncoder(sp_tokenizer(), c);
}

Record rec(std::vector<std::pair<std::string, std::string>> turns, std::vector<std::string> images = {},
           std::string id = "r") {
  Record r;
  r.id = std::move(id);
  r.images = std::move(images);
  for (auto& [f, v] : turns) r.conversations.push_back({f, v});
  return r;
}

}  // namespace

TEST(Conversation, VicunaV1LabelsMatchLlavaPreprocessV1) {
  auto enc = encoder("vicuna_v1");
  ASSERT_GE(cases()["vicuna_v1"].size(), 5u);
  for (const auto& c : cases()["vicuna_v1"]) {
    const Record r = parse_record(c["record"].dump(), "fixture");
    auto out = enc.encode(r);
    EXPECT_EQ(out.ids, c["ids"].get<std::vector<int32_t>>()) << r.id;
    EXPECT_EQ(out.labels, c["labels"].get<std::vector<int32_t>>()) << r.id;
    EXPECT_EQ(out.num_images, static_cast<int>(r.images.size()));
  }
}

TEST(Conversation, PlainLabelsMatchLlavaPreprocessPlain) {
  auto enc = encoder("plain");
  for (const auto& c : cases()["plain"]) {
    const Record r = parse_record(c["record"].dump(), "fixture");
    auto out = enc.encode(r);
    EXPECT_EQ(out.ids, c["ids"].get<std::vector<int32_t>>()) << r.id;
    EXPECT_EQ(out.labels, c["labels"].get<std::vector<int32_t>>()) << r.id;
    EXPECT_EQ(out.roles[0], TokenRole::kSystem);
    EXPECT_EQ(out.roles[1], TokenRole::kImage);
    EXPECT_EQ(out.roles.back(), TokenRole::kAnswer);
  }
}

TEST(Conversation, RolesFollowTheTemplateStructure) {
  auto enc = encoder("vicuna_v1");
  const int n_img = cases()["image_seq_length"];
  auto r =
      rec({{"human", "What is this?\n<image>"}, {"gpt", "A cat."}, {"human", "Colour?"}, {"gpt", "Black."}},
          {"a.png"});
  auto out = enc.encode(r);
  ASSERT_EQ(out.ids.size(), out.roles.size());
  EXPECT_EQ(out.ids[0], 1);  // BOS
  EXPECT_EQ(out.roles[0], TokenRole::kSystem);
  // the system prompt is kSystem up to " USER", then questions; the image (moved up front) follows "USER: "
  const auto sys = sp_tokenizer()->encode(kVicunaSystem);
  for (size_t t = 0; t <= sys.size(); ++t) EXPECT_EQ(out.roles[t], TokenRole::kSystem) << t;
  EXPECT_EQ(out.roles[sys.size() + 1], TokenRole::kQuestion);
  size_t first_img = std::find(out.roles.begin(), out.roles.end(), TokenRole::kImage) - out.roles.begin();
  EXPECT_EQ(sp_tokenizer()->decode(
                std::vector<int32_t>(out.ids.begin() + sys.size() + 1, out.ids.begin() + first_img)),
            "USER: ");
  for (int k = 0; k < n_img; ++k) EXPECT_EQ(out.roles[first_img + k], TokenRole::kImage);
  // supervised <=> answer role; answers decode to the gpt texts plus </s>
  std::vector<int32_t> answer;
  for (size_t t = 0; t < out.ids.size(); ++t) {
    EXPECT_EQ(out.labels[t] != kIgnoreIndex, out.roles[t] == TokenRole::kAnswer) << t;
    if (out.labels[t] != kIgnoreIndex) answer.push_back(out.labels[t]);
  }
  EXPECT_EQ(sp_tokenizer()->decode(answer), "A cat.</s>Black.</s>");
  ASSERT_EQ(out.round_ends.size(), 2u);
  EXPECT_EQ(out.round_ends[1], out.ids.size());
  EXPECT_EQ(out.ids[out.round_ends[0] - 1], 2);  // </s>
}

TEST(Conversation, ImageFirstCanBeDisabled) {
  auto r = rec({{"human", "What is this?\n<image>"}, {"gpt", "A cat."}}, {"a.png"});
  auto moved = encoder("vicuna_v1", true).encode(r);
  auto kept = encoder("vicuna_v1", false).encode(r);
  auto first_image = [](const EncodedConversation& e) {
    return std::find(e.roles.begin(), e.roles.end(), TokenRole::kImage) - e.roles.begin();
  };
  EXPECT_LT(first_image(moved), first_image(kept));
  EXPECT_EQ(moved.roles[first_image(moved) - 1], TokenRole::kQuestion);
}

TEST(Conversation, ChatmlSupervisesAnswersAndImEnd) {
  ConversationConfig c;
  c.template_name = "chatml";
  c.image_seq_length = 3;
  c.image_token_id = 5000;
  std::shared_ptr<const Tokenizer> tok = load_tokenizer(gmod::test::fixture("tokenizer/llama3"));
  ConversationEncoder enc(tok, c);
  auto out = enc.encode(rec(
      {{"human", "<image>\nWhat colour?"}, {"gpt", "Red"}, {"human", "Sure?"}, {"gpt", "Yes"}}, {"a.png"}));
  std::vector<int32_t> answer, text;
  for (size_t t = 0; t < out.ids.size(); ++t) {
    if (out.labels[t] != kIgnoreIndex) answer.push_back(out.ids[t]);
    if (out.roles[t] != TokenRole::kImage) text.push_back(out.ids[t]);
    EXPECT_EQ(out.labels[t] != kIgnoreIndex, out.roles[t] == TokenRole::kAnswer) << t;
  }
  EXPECT_EQ(tok->decode(answer), "Red<|im_end|>Yes<|im_end|>");
  EXPECT_EQ(
      tok->decode(text),
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\nWhat "
      "colour?<|im_end|>\n"
      "<|im_start|>assistant\nRed<|im_end|>\n<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\nYes"
      "<|im_end|>\n");
  EXPECT_EQ(std::count(out.roles.begin(), out.roles.end(), TokenRole::kImage), 3);
  EXPECT_EQ(out.roles[0], TokenRole::kSystem);
  EXPECT_THROW(ConversationEncoder(sp_tokenizer(), c), std::invalid_argument);  // no <|im_start|>
}

TEST(Conversation, BadRecordsAreRejectedWithAReason) {
  auto enc = encoder("vicuna_v1");
  auto reason = [&](const Record& r) -> std::string {
    try {
      enc.encode(r, "f.json: record 9 (id 'x')");
      return "";
    } catch (const SampleError& e) {
      EXPECT_NE(std::string(e.what()).find("record 9"), std::string::npos);
      return e.reason();
    }
  };
  EXPECT_EQ(reason(rec({{"human", "<image>\nq"}, {"gpt", "a"}})), "placeholder");    // no image
  EXPECT_EQ(reason(rec({{"human", "q"}, {"gpt", "a"}}, {"a.png"})), "placeholder");  // no <image>
  EXPECT_EQ(reason(rec({{"human", "<image><image>"}, {"gpt", "a"}}, {"a.png"})), "placeholder");  // 2 vs 1
  EXPECT_EQ(reason(rec({{"human", "q"}, {"human", "q2"}, {"gpt", "a"}})), "roles");
  EXPECT_EQ(reason(rec({{"human", "q"}})), "no_answer");
  EXPECT_EQ(reason(rec({{"gpt", "hello"}})), "no_answer");
  EXPECT_EQ(reason(rec({{"human", "q"}, {"gpt", "  "}})), "no_answer");
  // leading gpt turn dropped, trailing question dropped: fine
  EXPECT_EQ(reason(rec({{"gpt", "hi"}, {"human", "q"}, {"gpt", "a"}, {"human", "more?"}})), "");
  EXPECT_THROW(encoder("nope"), std::invalid_argument);
}

TEST(Sample, TruncationCutsOnRoundBoundariesOrSkips) {
  auto enc = encoder("vicuna_v1");
  auto r = rec({{"human", "<image>\nFirst question?"},
                {"gpt", "First answer."},
                {"human", "Second question?"},
                {"gpt", "Second answer."},
                {"human", "Third?"},
                {"gpt", "Third answer."}},
               {"a.png"}, "long");
  const auto full = enc.encode(r);
  ASSERT_EQ(full.round_ends.size(), 3u);
  SampleConfig cfg;
  cfg.max_len = static_cast<int>(full.ids.size());
  auto s = make_sample(r, 4, enc, cfg, "w");
  EXPECT_FALSE(s.truncated);
  EXPECT_EQ(s.ids, full.ids);
  EXPECT_EQ(s.images.size(), 1u);
  EXPECT_EQ(s.index, 4u);
  EXPECT_EQ(s.id, "long");

  cfg.max_len = static_cast<int>(full.round_ends[1]) + 2;  // rounds 1-2 fit, round 3 does not
  s = make_sample(r, 4, enc, cfg, "w");
  EXPECT_TRUE(s.truncated);
  ASSERT_EQ(s.ids.size(), full.round_ends[1]);
  EXPECT_EQ(std::vector<int32_t>(full.ids.begin(), full.ids.begin() + s.ids.size()), s.ids);
  EXPECT_EQ(s.labels.back(), 2);  // ends on a supervised </s>
  EXPECT_EQ(s.images.size(), 1u);

  cfg.max_len = static_cast<int>(full.round_ends[0]) - 1;  // not even the first answer fits
  try {
    make_sample(r, 4, enc, cfg, "w");
    ADD_FAILURE();
  } catch (const SampleError& e) {
    EXPECT_EQ(e.reason(), "too_long");
  }
  cfg.max_len = static_cast<int>(full.round_ends[1]) + 2;
  cfg.truncation = TruncationMode::kSkip;
  EXPECT_THROW(make_sample(r, 4, enc, cfg, "w"), SampleError);
  // an image in a dropped round is dropped with it
  auto late = rec({{"human", "Hi?"}, {"gpt", "Hello."}, {"human", "<image>\nAnd this?"}, {"gpt", "A dog."}},
                  {"late.png"}, "late");
  const auto late_full = enc.encode(late);
  cfg.truncation = TruncationMode::kTurnBoundary;
  cfg.max_len = static_cast<int>(late_full.ids.size()) - 1;
  s = make_sample(late, 0, enc, cfg, "w");
  EXPECT_TRUE(s.images.empty());
  EXPECT_EQ(std::count(s.roles.begin(), s.roles.end(), TokenRole::kImage), 0);
  EXPECT_EQ(s.ids.size(), late_full.round_ends[0]);
  EXPECT_EQ(parse_truncation_mode("skip"), TruncationMode::kSkip);
  EXPECT_THROW(parse_truncation_mode("cut"), std::invalid_argument);
}

}  // namespace test_conversation
