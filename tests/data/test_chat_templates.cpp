// The LLM families' chat templates (llama3, llama3_1, chatml, qwen2_5, mistral) against transformers'
// apply_chat_template with the models' own templates (tests/fixtures/chat/cases.json from
// make_chat_template_fixtures.py): ids and answer-only labels, system messages, images, several rounds; the
// family's default template, the turn-end token generation stops at, truncation at round boundaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "data/conversation.h"
#include "data/sample.h"
#include "model/config.h"
#include "tests/common/paths.h"

using namespace gmod;
using nlohmann::json;

namespace {

const json& cases() {
  static const json j = [] {
    std::ifstream f(gmod::test::fixture("chat/cases.json"));
    return json::parse(f);
  }();
  return j;
}

std::shared_ptr<const Tokenizer> tokenizer_for(const std::string& tmpl) {
  static std::map<std::string, std::shared_ptr<const Tokenizer>> cache;
  const std::string dir = cases()["tokenizers"][tmpl];
  auto& t = cache[dir];
  if (!t) t = load_tokenizer(gmod::test::fixture("chat/" + dir));
  return t;
}

ConversationEncoder encoder(const std::string& tmpl, std::optional<std::string> system = std::nullopt) {
  ConversationConfig c;
  c.template_name = tmpl;
  c.image_seq_length = cases()["image_seq_length"];
  c.image_token_id = cases()["image_token_id"];
  c.system_prompt = std::move(system);
  return ConversationEncoder(tokenizer_for(tmpl), c);
}

Record rec(std::vector<std::pair<std::string, std::string>> turns, std::vector<std::string> images = {}) {
  Record r;
  r.id = "r";
  r.images = std::move(images);
  for (auto& [f, v] : turns) r.conversations.push_back({f, v});
  return r;
}

}  // namespace

TEST(ChatTemplates, IdsAndLabelsMatchApplyChatTemplate) {
  std::map<std::string, int> per_template;
  for (const auto& c : cases()["cases"]) {
    const std::string tmpl = c["template"];
    std::optional<std::string> system;
    if (!c["system"].is_null()) system = c["system"].get<std::string>();
    const Record r = parse_record(c["record"].dump(), "fixture");
    const auto out = encoder(tmpl, system).encode(r);
    const std::string what = tmpl + " system=" + c["system"].dump() + " " + r.id;
    EXPECT_EQ(out.ids, c["ids"].get<std::vector<int32_t>>()) << what << "\n" << c["text"].get<std::string>();
    EXPECT_EQ(out.labels, c["labels"].get<std::vector<int32_t>>()) << what;
    EXPECT_EQ(out.num_images, static_cast<int>(r.images.size())) << what;
    for (size_t t = 0; t < out.ids.size(); ++t)
      ASSERT_EQ(out.labels[t] != kIgnoreIndex, out.roles[t] == TokenRole::kAnswer) << what << " token " << t;
    ASSERT_FALSE(out.round_ends.empty());
    EXPECT_EQ(out.labels[out.round_ends.back() - 1], *encoder(tmpl).end_of_turn_id()) << what;
    ++per_template[tmpl];
  }
  for (const char* t : {"llama3", "llama3_1", "chatml", "qwen2_5", "mistral"})
    EXPECT_GE(per_template[t], 6) << t;
}

TEST(ChatTemplates, AnswersEndWithTheTurnEndToken) {
  const auto r = rec({{"human", "<image>\nWhat colour?"}, {"gpt", "Red"}, {"human", "Sure?"}, {"gpt", "Yes"}},
                     {"a.png"});
  const std::map<std::string, std::string> want = {{"llama3", "Red<|eot_id|>Yes<|eot_id|>"},
                                                   {"llama3_1", "Red<|eot_id|>Yes<|eot_id|>"},
                                                   {"chatml", "Red<|im_end|>Yes<|im_end|>"},
                                                   {"qwen2_5", "Red<|im_end|>Yes<|im_end|>"}};
  for (const auto& [tmpl, answers] : want) {
    const auto out = encoder(tmpl).encode(r);
    std::vector<int32_t> answer;
    for (int32_t l : out.labels)
      if (l != kIgnoreIndex) answer.push_back(l);
    EXPECT_EQ(tokenizer_for(tmpl)->decode(answer), answers) << tmpl;
    EXPECT_EQ(std::count(out.roles.begin(), out.roles.end(), TokenRole::kImage),
              int(cases()["image_seq_length"]));
    EXPECT_EQ(out.roles[0], TokenRole::kSystem) << tmpl;
  }
  // mistral: "[/INST]" then the answer and </s>, both supervised
  const auto m = encoder("mistral").encode(r);
  const auto tok = tokenizer_for("mistral");
  EXPECT_EQ(m.ids.front(), *tok->bos_id());
  EXPECT_EQ(m.labels.back(), *tok->eos_id());
  EXPECT_EQ(*encoder("mistral").end_of_turn_id(), *tok->eos_id());
  EXPECT_EQ(*encoder("llama3").end_of_turn_id(), *tokenizer_for("llama3")->token_to_id("<|eot_id|>"));
  EXPECT_EQ(*encoder("qwen2_5").end_of_turn_id(), *tokenizer_for("qwen2_5")->token_to_id("<|im_end|>"));
}

TEST(ChatTemplates, AutoPicksTheFamilyTemplate) {
  LlamaConfig c;  // LLaMA-2 7B
  EXPECT_EQ(resolve_conversation_template("auto", c), "vicuna_v1");
  c.vocab_size = 128256;  // LLaMA-3
  EXPECT_EQ(resolve_conversation_template("auto", c), "llama3");
  c.rope_scaling.type = "llama3";  // LLaMA-3.1 / 3.2
  EXPECT_EQ(resolve_conversation_template("auto", c), "llama3_1");
  c.family = LlmFamily::kQwen2;
  EXPECT_EQ(resolve_conversation_template("auto", c), "chatml");
  c.family = LlmFamily::kMistral;
  EXPECT_EQ(resolve_conversation_template("auto", c), "mistral");
  EXPECT_EQ(resolve_conversation_template("qwen2_5", c), "qwen2_5");  // an explicit name wins
  for (const char* t : {"vicuna_v1", "plain", "chatml", "qwen2_5", "llama3", "llama3_1", "mistral", "auto"})
    EXPECT_TRUE(is_conversation_template(t)) << t;
  EXPECT_FALSE(is_conversation_template("llama2"));
  ConversationConfig c3;
  c3.template_name = "auto";  // resolved before an encoder is built
  EXPECT_THROW(ConversationEncoder(tokenizer_for("llama3"), c3), std::invalid_argument);
}

TEST(ChatTemplates, TemplatesRefuseTokenizersWithoutTheirTokens) {
  ConversationConfig c;
  c.template_name = "llama3";
  EXPECT_THROW(ConversationEncoder(tokenizer_for("chatml"), c), std::invalid_argument);  // no <|eot_id|>
  c.template_name = "qwen2_5";
  EXPECT_THROW(ConversationEncoder(tokenizer_for("llama3"), c), std::invalid_argument);  // no <|im_start|>
  c.template_name = "mistral";
  EXPECT_THROW(ConversationEncoder(tokenizer_for("chatml"), c), std::invalid_argument);  // no BOS
}

TEST(ChatTemplates, TruncationCutsAfterATurnEnd) {
  for (const char* tmpl : {"llama3_1", "chatml", "mistral"}) {
    const auto enc = encoder(tmpl);
    const auto r = rec({{"human", "<image>\nFirst question?"},
                        {"gpt", "First answer."},
                        {"human", "Second question?"},
                        {"gpt", "Second answer."}},
                       {"a.png"});
    const auto full = enc.encode(r);
    ASSERT_EQ(full.round_ends.size(), 2u) << tmpl;
    SampleConfig cfg;
    cfg.max_len = static_cast<int>(full.round_ends[1]) - 1;  // the second answer's turn end does not fit
    const auto s = make_sample(r, 0, enc, cfg, "w");
    EXPECT_TRUE(s.truncated) << tmpl;
    ASSERT_EQ(s.ids.size(), full.round_ends[0]) << tmpl;
    EXPECT_EQ(s.labels.back(), *enc.end_of_turn_id()) << tmpl;
    EXPECT_EQ(s.images.size(), 1u) << tmpl;
  }
}
