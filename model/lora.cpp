#include "model/lora.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "model/llava.h"
#include "model/strings.h"

namespace gmod {

namespace {

uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// PEFT's rule for a list of target_modules: the module name equals the entry or ends with "." + entry.
bool matches(const std::string& module, const std::vector<std::string>& targets) {
  for (const auto& t : targets) {
    if (t == "all-linear") return true;
    if (module == t || ends_with(module, "." + t)) return true;
  }
  return false;
}

// The LLM's decoder-layer linears are the candidates: llm.layers.{i}.<...>, routers excluded.
bool candidate(const std::string& name) {
  return starts_with(name, "llm.layers.") && name.find("router") == std::string::npos &&
         name.find("lora_") == std::string::npos;
}

}  // namespace

nlohmann::json to_json(const LoraConfig& c) {
  return nlohmann::json{{"r", c.r},       {"alpha", c.alpha},  {"dropout", c.dropout}, {"targets", c.targets},
                        {"bias", c.bias}, {"vision", c.vision}};
}

std::vector<std::string> check_lora_config(const LoraConfig& c) {
  std::vector<std::string> e;
  if (c.r < 0) e.push_back("lora.r: " + std::to_string(c.r) + " is negative (0 = no LoRA)");
  if (!c.enabled()) return e;
  if (!(c.alpha > 0)) e.push_back("lora.alpha: must be > 0");
  if (!(c.dropout >= 0 && c.dropout < 1)) e.push_back("lora.dropout: must be in [0, 1)");
  if (c.targets.empty())
    e.push_back("lora.targets: empty (name the linear layers to adapt, e.g. q_proj, v_proj)");
  for (const auto& t : c.targets)
    if (t.empty()) e.push_back("lora.targets: an empty entry");
  if (c.bias != "none")
    e.push_back("lora.bias: \"" + c.bias +
                "\" is not built (only \"none\": biases stay frozen; PEFT's \"all\" and "
                "\"lora_only\" are not)");
  if (c.vision) e.push_back("lora.vision: adapters on the vision tower are not built (false: LLM only)");
  return e;
}

LoraAdapterImpl::LoraAdapterImpl(std::shared_ptr<LinearImpl> a, std::shared_ptr<LinearImpl> b, double scale_,
                                 double dropout_, int64_t index_, std::shared_ptr<LoraDropoutStream> stream_)
    : lora_A(std::move(a)),
      lora_B(std::move(b)),
      scale(scale_),
      dropout(dropout_),
      index(index_),
      stream(std::move(stream_)) {}

at::Tensor LoraAdapterImpl::delta(const at::Tensor& x) const {
  at::Tensor in = x;
  if (dropout > 0 && is_training()) {
    // A generator of x's device type seeded per (stream seed, pass, adapter): the same mask on recompute.
    at::Generator gen = at::globalContext().defaultGenerator(x.device()).clone();
    gen.set_current_seed(
        mix(stream->seed ^ mix(uint64_t(stream->pass) * 0x9E3779B97F4A7C15ull + uint64_t(index))));
    const double keep = 1.0 - dropout;
    at::Tensor mask = at::empty_like(x).bernoulli_(keep, gen);  // [..., in] of 0/1
    in = x * mask / keep;                                       // nn.Dropout: x * mask / (1 - p)
  }
  return lora_B->forward(lora_A->forward(in)) * scale;
}

std::shared_ptr<LoraAdapterImpl> lora_adapter_of(const LinearImpl& l) {
  for (const auto& c : l.named_children())
    if (c.key() == "lora_adapter") return std::dynamic_pointer_cast<LoraAdapterImpl>(c.value());
  return nullptr;
}

at::Tensor lora_linear(const LinearImpl& l, const at::Tensor& x) {
  at::Tensor y = l.forward(x);
  if (l.children().empty()) return y;  // the common case: no adapter
  const auto a = lora_adapter_of(l);
  return a ? y + a->delta(x) : y;
}

std::vector<std::pair<std::string, std::shared_ptr<LinearImpl>>> lora_modules(const MultimodalLM& model) {
  std::vector<std::pair<std::string, std::shared_ptr<LinearImpl>>> out;
  for (const auto& m : model.named_modules("", /*include_self=*/false)) {
    auto lin = std::dynamic_pointer_cast<LinearImpl>(m.value());
    if (lin && lora_adapter_of(*lin)) out.emplace_back(m.key(), lin);
  }
  return out;
}

std::shared_ptr<LoraDropoutStream> lora_dropout_stream(const MultimodalLM& model) {
  const auto mods = lora_modules(model);
  return mods.empty() ? nullptr : lora_adapter_of(*mods.front().second)->stream;
}

LoraAttachment attach_lora(MultimodalLM& model, const LoraConfig& c, uint64_t init_seed) {
  for (const auto& e : check_lora_config(c)) throw std::invalid_argument(e);
  if (!c.enabled()) throw std::invalid_argument("attach_lora: lora.r is 0");
  if (!lora_modules(model).empty())
    throw std::logic_error("attach_lora: the model already has LoRA adapters");
  LoraAttachment att;
  att.stream = std::make_shared<LoraDropoutStream>();
  std::vector<std::pair<std::string, std::shared_ptr<LinearImpl>>> chosen;
  std::vector<std::string> candidates;
  for (const auto& m : model.named_modules("", /*include_self=*/false)) {
    auto lin = std::dynamic_pointer_cast<LinearImpl>(m.value());
    if (!lin || !candidate(m.key())) continue;
    candidates.push_back(m.key());
    if (matches(m.key(), c.targets) || matches(hf_module_name(model, m.key()), c.targets))
      chosen.emplace_back(m.key(), lin);
  }
  if (chosen.empty()) {
    std::string seen;
    for (size_t i = 0; i < candidates.size() && i < 8; ++i) seen += (i ? ", " : "") + candidates[i];
    std::string t;
    for (const auto& x : c.targets) t += (t.empty() ? "" : ", ") + x;
    throw std::invalid_argument("lora.targets [" + t +
                                "] match no linear layer of the LLM (its linears are named " +
                                (seen.empty() ? std::string("(none)") : seen + ", ...") + ")");
  }
  // A rank above a layer's width adds nothing LoRA can use and can ask the allocator for absurd sizes.
  for (const auto& [name, lin] : chosen) {
    const int64_t in = lin->weight.size(1), out = lin->weight.size(0);
    if (c.r > std::min(in, out))
      throw std::invalid_argument("lora.r: " + std::to_string(c.r) + " exceeds the width of " + name + " (" +
                                  std::to_string(out) + " x " + std::to_string(in) +
                                  "); a LoRA rank is at most min(out, in) = " + std::to_string(std::min(in, out)));
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(init_seed ^ 0x4C6F5241ull);  // "LoRA"
  at::NoGradGuard no_grad;
  int64_t index = 0;
  for (auto& [name, lin] : chosen) {
    const int64_t in = lin->weight.size(1), out = lin->weight.size(0);
    auto a = std::make_shared<LinearImpl>(in, c.r, false);
    auto b = std::make_shared<LinearImpl>(c.r, out, false);
    const double bound = 1.0 / std::sqrt(double(in));  // kaiming_uniform_(a=sqrt(5)) on [r, in]
    a->weight.copy_(at::empty({c.r, in}, at::kFloat).uniform_(-bound, bound, gen));
    b->weight.zero_();
    const auto opts = lin->weight.options();
    a->weight.set_data(a->weight.to(opts.device(), opts.dtype()));
    b->weight.set_data(b->weight.to(opts.device(), opts.dtype()));
    lin->register_module("lora_A", a);
    lin->register_module("lora_B", b);
    lin->register_module("lora_adapter",
                         std::make_shared<LoraAdapterImpl>(a, b, c.scale(), c.dropout, index++, att.stream));
    if (!lin->is_training()) lin->eval();
    att.modules.push_back(name);
    att.parameters += a->weight.numel() + b->weight.numel();
  }
  return att;
}

namespace {
int remove_adapters(MultimodalLM& model, bool merge) {
  const auto mods = lora_modules(model);
  at::NoGradGuard no_grad;
  for (const auto& [name, lin] : mods) {
    if (merge) {
      const auto a = lora_adapter_of(*lin);
      at::Tensor d =
          at::matmul(a->lora_B->weight.to(at::kFloat), a->lora_A->weight.to(at::kFloat)) * a->scale;
      lin->weight.copy_((lin->weight.to(at::kFloat) + d).to(lin->weight.scalar_type()));
    }
    lin->unregister_module("lora_adapter");
    lin->unregister_module("lora_A");
    lin->unregister_module("lora_B");
  }
  return int(mods.size());
}
}  // namespace

int merge_lora(MultimodalLM& model) { return remove_adapters(model, true); }
int detach_lora(MultimodalLM& model) { return remove_adapters(model, false); }

std::string hf_module_name(const MultimodalLM& model, const std::string& gmod_module) {
  if (!starts_with(gmod_module, "llm."))
    throw std::logic_error("hf_module_name: " + gmod_module + " is not an LLM module");
  const bool llava = model.vision && !model.config.original_layout();
  return (llava ? "model.language_model." : "model.") + gmod_module.substr(4);
}

bool is_lora_parameter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

}  // namespace gmod
