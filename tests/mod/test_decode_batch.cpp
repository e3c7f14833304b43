// The stepwise decoder (mod/decode_batch.h): a request that joins a running batch, leaves it, or reuses a
// freed row produces the tokens it produces alone through generate(), for the dense fixture and a skipping
// γ-MoD model, with and without images. Greedy; tokens must be equal, logits within fp32 tolerance (a batch's
// matmuls and the masked attention over a longer, holed key range sum in another order than the request's own
// batch of one).
#include <gtest/gtest.h>

#include <map>

#include "mod/conversion.h"
#include "mod/decode_batch.h"
#include "mod/fastv.h"
#include "mod/generate.h"
#include "mod/mod_layer.h"
#include "mod/pdrop.h"
#include "mod/pmod.h"
#include "model/safetensors.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

constexpr double kTol = 1e-4;

// Sample b of the fixture batch as a prompt of its own (its valid tokens and its images).
ModelInputs sample(const ModelInputs& in, int64_t b, int64_t image_id, int64_t image_tokens) {
  auto mask = in.attention_mask.to(at::kBool);
  const int64_t n = mask[b].sum().item<int64_t>();
  int64_t before = 0;
  for (int64_t i = 0; i < b; ++i)
    before += (in.input_ids[i] == image_id).sum().item<int64_t>() / image_tokens;
  const int64_t mine = (in.input_ids[b] == image_id).sum().item<int64_t>() / image_tokens;
  ModelInputs p;
  p.input_ids = in.input_ids[b].narrow(0, 0, n).unsqueeze(0).clone();
  p.attention_mask = at::ones({1, n}, at::kBool);
  p.token_roles = in.token_roles[b].narrow(0, 0, n).unsqueeze(0).clone();
  if (mine > 0) p.pixel_values = in.pixel_values.narrow(0, before, mine).clone();
  return p;
}

// A text-only prompt of `n` tokens (ids from `seed`, no image token).
ModelInputs text_prompt(int64_t n, uint64_t seed, int64_t image_id) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto ids = at::randint(3, 200, {1, n}, gen, at::kLong);
  ids.masked_fill_(ids == image_id, 7);
  ModelInputs p;
  p.input_ids = ids;
  p.attention_mask = at::ones({1, n}, at::kBool);
  p.token_roles = test::make_roles(ids, p.attention_mask, image_id);
  return p;
}

struct Request {
  ModelInputs prompt;
  int64_t join_step = 0;   // admitted after this many decode steps of the batch
  int64_t max_new = 6;     // tokens it generates, then it is released
  int64_t cut_after = -1;  // >= 0: released (cancelled) after this many tokens
};

struct Decoded {
  std::vector<int64_t> tokens;
  std::vector<at::Tensor> logits;  // [V] per token
  std::vector<int64_t> rows;       // the row it was admitted into
};

// Runs the schedule on one DecodeBatch (greedy); `compact` drops released rows before each step. Rows seen
// per step are returned in `rows_per_step`.
std::vector<Decoded> drive(MultimodalLM& model, const std::vector<Request>& reqs, bool compact,
                           std::vector<int64_t>* rows_per_step = nullptr,
                           std::vector<int64_t>* columns = nullptr) {
  at::NoGradGuard ng;
  DecodeBatch batch(model);
  std::vector<Decoded> out(reqs.size());
  std::map<int64_t, size_t> at_row;  // row -> request
  auto take = [&](size_t i, int64_t row, const at::Tensor& logits) {
    out[i].logits.push_back(logits);
    out[i].tokens.push_back(logits.argmax(-1).item<int64_t>());
    const int64_t limit = reqs[i].cut_after >= 0 ? reqs[i].cut_after : reqs[i].max_new;
    if (int64_t(out[i].tokens.size()) >= limit) {
      batch.release(row);
      at_row.erase(row);
    }
  };
  size_t admitted = 0;
  for (int64_t s = 0;; ++s) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i].join_step != s) continue;
      auto a = batch.admit(reqs[i].prompt, reqs[i].max_new);
      out[i].rows = a.rows;
      at_row[a.rows[0]] = i;
      ++admitted;
      take(i, a.rows[0], a.logits[0]);
    }
    if (columns) columns->push_back(batch.column());
    if (at_row.empty()) {
      if (admitted == reqs.size()) break;
      continue;
    }
    if (compact) {
      auto map = batch.compact();
      std::map<int64_t, size_t> moved;
      for (auto& [row, i] : at_row) moved[map[size_t(row)]] = i;
      at_row = moved;
      EXPECT_EQ(batch.rows(), int64_t(at_row.size())) << "released rows must leave the batch";
    }
    auto tokens = at::zeros({batch.rows()}, at::kLong);
    for (auto& [row, i] : at_row) tokens[row] = out[i].tokens.back();
    if (rows_per_step) rows_per_step->push_back(batch.rows());
    auto logits = batch.step(tokens);
    for (auto [row, i] : std::map<int64_t, size_t>(at_row)) take(i, row, logits[row]);
  }
  return out;
}

// The request alone through generate(): equal tokens, logits within kTol (up to cut_after tokens).
void expect_as_alone(MultimodalLM& model, const Request& r, const Decoded& d, const std::string& what) {
  GenerateOptions o;
  o.max_new_tokens = r.max_new;
  o.eos_token_id = -1;
  o.keep_logits = true;
  auto alone = generate(model, r.prompt, o);
  const int64_t n = int64_t(d.tokens.size());
  ASSERT_EQ(n, r.cut_after >= 0 ? r.cut_after : r.max_new) << what;
  for (int64_t t = 0; t < n; ++t) {
    EXPECT_EQ(d.tokens[size_t(t)], alone.tokens[0][t].item<int64_t>()) << what << " token " << t;
    EXPECT_LT((d.logits[size_t(t)] - alone.step_logits[size_t(t)][0]).abs().max().item<double>(), kTol)
        << what << " token " << t;
  }
  // The first token comes from the request's own prefill: bitwise.
  EXPECT_TRUE(at::equal(d.logits[0], alone.step_logits[0][0])) << what;
}

struct Models {
  std::shared_ptr<MultimodalLM> dense, mod;
  int64_t image_id = 0, image_tokens = 0;
  ModelInputs in;
};

Models& models() {
  static Models m = [] {
    Models r;
    r.dense = load_pretrained(test::llava_fixture());
    r.dense->eval();
    r.mod = test::random_llava(4, 3);
    MoDConfig cfg;
    cfg.mod_layers = {1, 2, 3};
    cfg.infer_threshold = 0.5;  // skips at prefill and at decode
    convert_to_mod(*r.mod, cfg);
    {
      at::NoGradGuard ng;
      shared_router(*r.mod)->weight.mul_(40.0);  // spread p around 0.5
    }
    r.mod->eval();
    r.in = test::fixture_inputs();
    r.image_id = r.dense->config.image_token_id;
    r.image_tokens = r.dense->config.image_seq_length();
    return r;
  }();
  return m;
}

class DecodeBatchTest : public ::testing::TestWithParam<bool> {  // true: γ-MoD
 protected:
  MultimodalLM& model() { return GetParam() ? *models().mod : *models().dense; }
  ModelInputs fixture(int64_t b) {
    auto& m = models();
    return sample(m.in, b, m.image_id, m.image_tokens);
  }
  ModelInputs text(int64_t n, uint64_t seed) { return text_prompt(n, seed, models().image_id); }
};

}  // namespace

TEST_P(DecodeBatchTest, JoinerAtStepKEqualsItselfAlone) {
  // A running batch of an image prompt and a text prompt; an image prompt joins at step 2, a text one at
  // step 3.
  std::vector<Request> reqs = {
      {fixture(0), 0, 8}, {text(9, 1), 0, 7}, {fixture(1), 2, 6}, {fixture(2), 3, 5}};
  auto d = drive(model(), reqs, false);
  for (size_t i = 0; i < reqs.size(); ++i)
    expect_as_alone(model(), reqs[i], d[i], "request " + std::to_string(i));
  EXPECT_EQ(d[2].rows[0], 2);  // joined as new rows
  EXPECT_EQ(d[3].rows[0], 3);
}

TEST_P(DecodeBatchTest, ReleasedRowsLeaveTheOthersUnchanged) {
  // Request 1 is cancelled after 2 tokens, request 0 after 3: the others go on as alone, compacted or not.
  std::vector<Request> reqs = {
      {fixture(0), 0, 6, 3}, {fixture(1), 0, 6, 2}, {text(11, 2), 0, 7}, {fixture(2), 1, 6}};
  for (bool compact : {false, true}) {
    auto d = drive(model(), reqs, compact);
    for (size_t i = 0; i < reqs.size(); ++i)
      expect_as_alone(model(), reqs[i], d[i], "request " + std::to_string(i) + (compact ? " compacted" : ""));
  }
}

TEST_P(DecodeBatchTest, JoinerReusesAFreedRow) {
  // Request 1 ends after 2 tokens (1 step); request 2 joins at step 3 and takes its row.
  std::vector<Request> reqs = {
      {fixture(0), 0, 7}, {text(6, 3), 0, 2}, {text(8, 4), 0, 7}, {fixture(2), 3, 4}};
  std::vector<int64_t> rows;
  auto d = drive(model(), reqs, false, &rows);
  for (size_t i = 0; i < reqs.size(); ++i)
    expect_as_alone(model(), reqs[i], d[i], "request " + std::to_string(i));
  EXPECT_EQ(d[3].rows[0], d[1].rows[0]);
  for (auto r : rows) EXPECT_EQ(r, 3);  // the batch never grew
}

TEST_P(DecodeBatchTest, LongerJoinerAdvancesTheSharedColumn) {
  // Short text prompts decode; the two-image prompt (37 tokens) joins at step 2, past the column (5 + 2).
  std::vector<Request> reqs = {{text(5, 5), 0, 8}, {text(4, 6), 0, 9}, {fixture(1), 2, 5}};
  std::vector<int64_t> columns;
  auto d = drive(model(), reqs, false, nullptr, &columns);
  for (size_t i = 0; i < reqs.size(); ++i)
    expect_as_alone(model(), reqs[i], d[i], "request " + std::to_string(i));
  EXPECT_EQ(columns[0], 5);
  EXPECT_EQ(columns[2], 37);  // advanced to the joiner's prompt
  EXPECT_EQ(columns[3], 38);
}

TEST_P(DecodeBatchTest, AccountingCountsOnlyActiveRows) {
  // Prefills and steps of a joined run count exactly the tokens of the requests decoded alone.
  std::vector<Request> reqs = {{fixture(0), 0, 5}, {text(7, 7), 0, 2}, {fixture(2), 2, 3}};
  at::NoGradGuard ng;
  DecodeBatch batch(model());
  int64_t alone_total = 0;
  for (auto& r : reqs) {
    GenerateOptions o;
    o.max_new_tokens = r.max_new;
    o.eos_token_id = -1;
    alone_total += generate(model(), r.prompt, o).compute.total;
  }
  auto a0 = batch.admit(reqs[0].prompt, 5), a1 = batch.admit(reqs[1].prompt, 2);
  auto tok = at::stack({a0.logits[0].argmax(), a1.logits[0].argmax()});
  auto logits = batch.step(tok);  // request 1's second token: it is done
  batch.release(a1.rows[0]);
  auto a2 = batch.admit(reqs[2].prompt, 3);  // reuses row 1
  ASSERT_EQ(a2.rows[0], 1);
  for (int s = 0; s < 3; ++s) {
    tok = logits.argmax(-1);
    tok[1] = (s == 0 ? a2.logits[0] : logits[1]).argmax();
    logits = batch.step(tok);
    if (s == 1) batch.release(1);  // request 2 has its 3 tokens
  }
  EXPECT_EQ(batch.compute().total, alone_total);
  EXPECT_EQ(batch.active_rows(), 1);
}

INSTANTIATE_TEST_SUITE_P(DenseAndMoD, DecodeBatchTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "GammaMoD" : "Dense"; });

TEST(DecodeBatch, JoinerOverTheContextWaitsUntilTheBatchDrains) {
  auto& model = *models().dense;
  at::NoGradGuard ng;
  DecodeBatchOptions o;
  o.context = 48;
  DecodeBatch batch(model, o);
  auto a = batch.admit(text_prompt(20, 8, models().image_id), 10);  // column 20, 9 steps to come
  EXPECT_TRUE(batch.fits(30, 10));                                  // max(20, 30) + 9 <= 48
  EXPECT_FALSE(batch.fits(40, 10));                                 // 40 + 9 > 48
  EXPECT_FALSE(batch.fits(20, 30));                                 // 20 + 29 > 48
  EXPECT_THROW(batch.admit(text_prompt(40, 9, models().image_id), 10), std::logic_error);
  EXPECT_EQ(batch.rows(), 1);  // the refused prompt took no row
  batch.release(a.rows[0]);
  EXPECT_EQ(batch.rows(), 0);  // drained: reset
  EXPECT_TRUE(batch.fits(40, 10));
  batch.admit(text_prompt(40, 9, models().image_id), 10);
  EXPECT_EQ(batch.column(), 40);
}

TEST(DecodeBatch, RecomputationCannotJoin) {
  auto& model = *models().dense;
  at::NoGradGuard ng;
  DecodeBatchOptions o;
  o.use_cache = false;
  DecodeBatch batch(model, o);
  batch.admit(text_prompt(6, 10, models().image_id), 4);
  EXPECT_THROW(batch.admit(text_prompt(6, 11, models().image_id), 4), std::logic_error);
}

TEST(DecodeBatch, FastVJoinerEqualsItselfAlone) {
  // FastV (K 2, R 0.5) on its fixture: the two image prompts of tests/fixtures/fastv, the second joining at step 2.
  auto m = load_pretrained(test::fixture("fastv/model"));
  convert_to_mod(*m, fastv_config(2, 0.5, m->config.text.num_hidden_layers));
  m->eval();
  SafetensorsFile ref(test::fixture("fastv/reference.safetensors"));
  const int64_t img = m->config.image_token_id;
  auto inputs = [&](const std::string& c) {
    ModelInputs in;
    in.input_ids = ref.tensor(c + ".input_ids").clone();
    in.pixel_values = ref.tensor(c + ".pixel_values").clone();
    in.attention_mask = at::ones(in.input_ids.sizes(), at::kBool);
    // System before the image, the image, the question after it (as test_fastv.cpp).
    auto roles = at::full(in.input_ids.sizes(), static_cast<int64_t>(TokenRole::kQuestion), at::kChar);
    const int64_t first = (in.input_ids[0] == img).to(at::kLong).argmax().item<int64_t>();
    roles.narrow(1, 0, first).fill_(static_cast<int64_t>(TokenRole::kSystem));
    roles.masked_fill_(in.input_ids == img, static_cast<int64_t>(TokenRole::kImage));
    in.token_roles = roles;
    return in;
  };
  std::vector<Request> reqs = {{inputs("k2_r50"), 0, 6}, {inputs("k1_r75"), 2, 4}};
  auto d = drive(*m, reqs, false);
  for (size_t i = 0; i < reqs.size(); ++i) expect_as_alone(*m, reqs[i], d[i], "FastV request " + std::to_string(i));
}

TEST(DecodeBatch, PDropJoinersEqualThemselvesAlone) {
  // PyramidDrop (mod/pdrop.h, stages from layers 1 and 3 keeping 50% and 25% of the image tokens, each stage's layers
  // caching only those): image prompts and a text prompt joining a running batch decode as they do alone.
  auto m = test::random_llava(4, 3);
  convert_to_mod(*m, parse_pdrop("1,3:0.5,0.25", 4));
  m->eval();
  auto& f = models();
  std::vector<Request> reqs = {{sample(f.in, 0, f.image_id, f.image_tokens), 0, 6},
                               {sample(f.in, 1, f.image_id, f.image_tokens), 2, 4},
                               {text_prompt(9, 5, f.image_id), 3, 3}};
  auto d = drive(*m, reqs, false);
  for (size_t i = 0; i < reqs.size(); ++i) expect_as_alone(*m, reqs[i], d[i], "PyramidDrop request " + std::to_string(i));
  GenerateOptions o;  // the image prompt really drops tokens
  o.max_new_tokens = 2;
  o.eos_token_id = -1;
  const auto r = generate(*m, reqs[0].prompt, o);
  EXPECT_GT(r.compute.mod_skip_ratio(), 0.1);
}

TEST(DecodeBatch, PModJoinersEqualThemselvesAlone) {
  // p-MoD (its schedule on 4 layers, N = 3: layers 1-3 keep 75%, 25% and 15% of the image tokens and cache only those):
  // image prompts of the fixture and a text prompt joining a running batch decode as they do alone. Routers drawn
  // at random (p-MoD initialises them to zero: every token would tie).
  auto m = test::random_llava(4, 3);
  convert_to_mod(*m, pmod_config(4));
  {
    at::NoGradGuard ng;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    for (auto& p : m->named_parameters())
      if (p.key().find("router") != std::string::npos) p.value().normal_(0.0, 2.0, gen);
  }
  m->eval();
  auto& f = models();
  std::vector<Request> reqs = {{sample(f.in, 0, f.image_id, f.image_tokens), 0, 6},
                               {sample(f.in, 1, f.image_id, f.image_tokens), 2, 4},
                               {text_prompt(9, 5, f.image_id), 3, 3}};
  auto d = drive(*m, reqs, false);
  for (size_t i = 0; i < reqs.size(); ++i) expect_as_alone(*m, reqs[i], d[i], "p-MoD request " + std::to_string(i));
  GenerateOptions o;  // the image prompt really skips tokens in the p-MoD layers
  o.max_new_tokens = 2;
  o.eos_token_id = -1;
  const auto r = generate(*m, reqs[0].prompt, o);
  EXPECT_GT(r.compute.mod_skip_ratio(), 0.1);
}
