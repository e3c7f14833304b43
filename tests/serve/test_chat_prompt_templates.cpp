// `gmod serve`'s prompt for the LLM families' chat templates equals transformers' apply_chat_template(...,
// add_generation_prompt=True) with the models' own templates (tests/fixtures/chat/cases.json "prompts", from
// make_chat_template_fixtures.py): system message given or the template's default, one and several rounds.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "data/conversation.h"
#include "data/dataset.h"
#include "serve/chat_prompt.h"
#include "tests/common/paths.h"

using namespace gmod;
using nlohmann::json;

TEST(ChatPromptTemplates, PromptsMatchApplyChatTemplateWithGenerationPrompt) {
  std::ifstream f(gmod::test::fixture("chat/cases.json"));
  const json j = json::parse(f);
  std::map<std::string, std::shared_ptr<const Tokenizer>> toks;
  int n = 0;
  for (const auto& c : j["prompts"]) {
    const std::string tmpl = c["template"];
    const std::string dir = j["tokenizers"][tmpl];
    if (!toks[dir]) toks[dir] = load_tokenizer(gmod::test::fixture("chat/" + dir));
    ConversationConfig cc;
    cc.template_name = tmpl;
    ConversationEncoder enc(toks[dir], cc);
    serve::ChatRequest req;
    if (!c["system"].is_null()) req.messages.push_back({"system", c["system"].get<std::string>()});
    for (const auto& t : c["turns"])
      req.messages.push_back({t["from"] == "human" ? "user" : "assistant", t["value"].get<std::string>()});
    const serve::PreparedPrompt p = serve::prepare_prompt(req, enc, DatasetConfig{}, false, 0);
    EXPECT_EQ(std::vector<int64_t>(p.ids.begin(), p.ids.end()), c["ids"].get<std::vector<int64_t>>())
        << tmpl << " system=" << c["system"].dump() << " " << c["turns"].dump();
    ++n;
  }
  EXPECT_EQ(n, 20);
}
