#include "model/torch_save.h"

#include <torch/serialize.h>

#include <fstream>
#include <iterator>
#include <stdexcept>

namespace gmod {
namespace {

void flatten(const c10::IValue& v, const std::string& prefix, const std::string& path,
             std::vector<std::pair<std::string, at::Tensor>>& out) {
  if (v.isTensor()) {
    if (prefix.empty()) throw std::runtime_error(path + ": holds a single tensor, expected a dict of named tensors");
    out.emplace_back(prefix, v.toTensor().contiguous().clone());
    return;
  }
  if (!v.isGenericDict())
    throw std::runtime_error(path + ": " + (prefix.empty() ? std::string("top-level object") : "entry '" + prefix + "'") +
                             " is a " + v.tagKind() + ", expected a dict of tensors");
  for (const auto& kv : v.toGenericDict()) {
    if (!kv.key().isString())
      throw std::runtime_error(path + ": dict key of kind " + kv.key().tagKind() + " under '" + prefix +
                               "', expected strings");
    const std::string name = prefix.empty() ? kv.key().toStringRef() : prefix + "." + kv.key().toStringRef();
    flatten(kv.value(), name, path, out);
  }
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> read_torch_save(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open");
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() < 4 || bytes[0] != 'P' || bytes[1] != 'K')
    throw std::runtime_error(path + ": not a torch.save zip archive (the legacy pre-1.6 format is not supported; "
                             "re-save it with torch.save in a current PyTorch)");
  c10::IValue v;
  try {
    v = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": cannot unpickle: " + std::string(e.what()).substr(0, 400));
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  flatten(v, "", path, out);
  if (out.empty()) throw std::runtime_error(path + ": holds no tensor");
  return out;
}

}  // namespace gmod
