// gmod's model against transformers on committed fixtures (tests/fixtures/make_hf_fixtures.py):
// logits within 1e-5 max abs (fp32), gradients within 1e-4 relative, loss equal.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/hf_names.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace {

struct Case {
  std::shared_ptr<MultimodalLM> model;
  SafetensorsFile ref;
  ModelInputs in;
};

ModelInputs inputs_from(const SafetensorsFile& ref) {
  ModelInputs in;
  in.input_ids = ref.tensor("input.input_ids").clone();
  in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  in.labels = ref.tensor("input.labels").clone();
  if (ref.has("input.pixel_values")) in.pixel_values = ref.tensor("input.pixel_values").clone();
  return in;
}

double max_abs_on_valid(const at::Tensor& a, const at::Tensor& b, const at::Tensor& valid) {
  auto m = valid.unsqueeze(-1).expand_as(a);
  return (a - b).abs().masked_select(m).max().item<double>();
}

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, LogitsLossAndGradientsMatchTransformersFp32) {
  const auto dir = test::fixture("hf/" + GetParam());
  auto model = load_pretrained(dir);
  SafetensorsFile ref(dir + "/reference.safetensors");
  auto in = inputs_from(ref);
  auto out = model->forward(in);
  const double logit_err = max_abs_on_valid(out.logits, ref.tensor("logits"), in.attention_mask);
  EXPECT_LT(logit_err, 1e-5) << "max abs logit difference";
  EXPECT_NEAR(out.lm_loss.item<double>(), ref.tensor("loss").item<double>(), 1e-5);
  out.lm_loss.backward();
  auto params = model->named_parameters();
  int checked = 0;
  for (const auto& name : ref.names()) {
    if (name.rfind("grad.", 0) != 0) continue;
    const auto hf = name.substr(5);
    auto gname = hf_to_gmod(hf);
    if (model->config.text.tie_word_embeddings && gname == "llm.embed_tokens.weight") gname = "llm.embed_tokens.weight";
    ASSERT_TRUE(gname && params.contains(*gname)) << hf;
    auto g = params[*gname].grad();
    ASSERT_TRUE(g.defined()) << *gname << " has no gradient";
    auto r = ref.tensor(name);
    const double rel = (g - r).norm().item<double>() / r.norm().item<double>();
    EXPECT_LT(rel, 1e-4) << "gradient of " << *gname;
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

TEST_P(HfParity, Bf16LogitsTrackTransformersBf16) {
  const auto dir = test::fixture("hf/" + GetParam());
  auto model = load_pretrained(dir, at::kBFloat16);
  SafetensorsFile ref(dir + "/reference.safetensors");
  SafetensorsFile ref16(dir + "/reference_bf16.safetensors");
  auto in = inputs_from(ref);
  in.pixel_values = in.pixel_values.defined() ? in.pixel_values.to(at::kBFloat16) : in.pixel_values;
  at::NoGradGuard ng;
  auto out = model->forward(in);
  // Both sides round differently inside bf16 kernels; what matters is that gmod in bf16 is as close to
  // the fp32 truth as transformers in bf16 is.
  const double ours = max_abs_on_valid(out.logits, ref.tensor("logits"), in.attention_mask);
  const double theirs = max_abs_on_valid(ref16.tensor("logits"), ref.tensor("logits"), in.attention_mask);
  EXPECT_LT(ours, 2.0 * theirs + 1e-3) << "gmod bf16 error " << ours << " vs transformers bf16 error " << theirs;
  EXPECT_EQ(out.logits.dtype(), at::kFloat);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParity, ::testing::Values("llama_untied_gqa", "llama_tied", "llava_layer_m2"));

}  // namespace

namespace {

// The same fixtures on the GPU (skipped without one): fp32 logits and loss as on the CPU reference.
TEST(HfParityCuda, LlavaFp32OnCudaMatchesTransformers) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto dir = test::fixture("hf/llava_layer_m2");
  auto model = load_pretrained(dir, at::kFloat, at::Device(at::kCUDA, 0));
  SafetensorsFile ref(dir + "/reference.safetensors");
  auto in = inputs_from(ref);
  in.input_ids = in.input_ids.cuda();
  in.attention_mask = in.attention_mask.cuda();
  in.labels = in.labels.cuda();
  in.pixel_values = in.pixel_values.cuda();
  auto out = model->forward(in);
  // TF32 is off by default in LibTorch matmuls, so fp32 on the GPU stays close to the CPU reference.
  EXPECT_LT(max_abs_on_valid(out.logits.cpu(), ref.tensor("logits"), in.attention_mask.cpu()), 1e-4);
  EXPECT_NEAR(out.lm_loss.item<double>(), ref.tensor("loss").item<double>(), 1e-4);
  out.lm_loss.backward();
  EXPECT_TRUE(model->named_parameters()["llm.layers.0.self_attn.q_proj.weight"].grad().defined());
}

}  // namespace
