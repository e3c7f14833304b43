#include "model/torch_save.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace gmod {
namespace {

class BytesReader : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesReader(const std::vector<char>& b) : b_(b) {}
  size_t size() const override { return b_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char*) const override {
    if (pos >= b_.size()) return 0;
    n = std::min<size_t>(n, b_.size() - pos);
    std::memcpy(buf, b_.data() + pos, n);
    return n;
  }

 private:
  const std::vector<char>& b_;
};

// The globals a torch.save of a dict of tensors references (protocol 2, what torch.save writes): the tensor rebuild
// function, the typed storages and the OrderedDict of a tensor's (empty) backward hooks.
bool allowed_global(const std::string& module, const std::string& name) {
  if (module == "torch._utils") return name == "_rebuild_tensor_v2" || name == "_rebuild_tensor";
  if (module == "collections") return name == "OrderedDict";
  if (module == "torch")
    return name.size() > 7 && name.compare(name.size() - 7, 7, "Storage") == 0 &&
           name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") == std::string::npos;
  return false;
}

// Walks every opcode of the pickle `p` (pickletools' table, protocols 0-5) and throws, naming `path`, at a global
// outside allowed_global or an opcode that builds objects from elsewhere (extension registry, protocol-4 stack
// globals, out-of-band buffers). Nothing is built here: LibTorch's unpickler does that afterwards.
void check_pickle(const char* p, size_t n, const std::string& path) {
  size_t i = 0;
  auto fail = [&](const std::string& what) {
    throw std::runtime_error(path + ": not a state dict of tensors as torch.save writes it: " + what);
  };
  auto need = [&](size_t k) {
    if (i + k > n) fail("the pickle ends inside an opcode");
  };
  auto line = [&]() {
    const void* e = std::memchr(p + i, '\n', n - i);
    if (!e) fail("the pickle ends inside an opcode");
    std::string s(p + i, static_cast<const char*>(e));
    i = static_cast<const char*>(e) - p + 1;
    return s;
  };
  auto le = [&](size_t k) {
    need(k);
    uint64_t v = 0;
    for (size_t j = 0; j < k; ++j) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i + j])) << (8 * j);
    i += k;
    return v;
  };
  auto skip = [&](uint64_t k) {
    if (k > n - i) fail("the pickle ends inside an opcode");
    i += k;
  };
  while (i < n) {
    const unsigned char op = static_cast<unsigned char>(p[i++]);
    switch (op) {
      case '.':  // STOP
        return;
      case '(': case '0': case '1': case '2': case 'N': case 0x88: case 0x89: case ')': case 't': case 0x85: case 0x86:
      case 0x87: case ']': case 'a': case 'e': case 'l': case '}': case 'd': case 's': case 'u': case 0x8f:
      case 0x90: case 0x91: case 0x94: case 'R': case 'b': case 'o': case 0x81: case 0x92: case 'Q':
        break;
      case 'I': case 'L': case 'S': case 'V': case 'F': case 'p': case 'g': case 'P':
        line();
        break;
      case 'K': case 'h': case 'q': case 0x80: skip(1); break;
      case 'M': skip(2); break;
      case 'J': case 'j': case 'r': skip(4); break;
      case 'G': case 0x95: skip(8); break;
      case 0x8a: case 'U': case 'C': case 0x8c: skip(le(1)); break;
      case 0x8b: case 'T': case 'X': case 'B': skip(le(4)); break;
      case 0x8d: case 0x8e: case 0x96: skip(le(8)); break;
      case 'c': case 'i': {  // GLOBAL / INST: module and name on two lines
        const std::string module = line(), name = line();
        if (!allowed_global(module, name)) fail("it references the Python global " + module + "." + name);
        break;
      }
      case 0x93: fail("a protocol-4 stack global (torch.save writes protocol 2)"); break;
      case 0x82: case 0x83: case 0x84: fail("an extension-registry object (EXT opcode)"); break;
      case 0x97: case 0x98: fail("an out-of-band buffer"); break;
      default: fail("unknown pickle opcode 0x" + [&] {
        char b[3];
        std::snprintf(b, sizeof b, "%02x", op);
        return std::string(b);
      }());
    }
  }
  fail("the pickle has no STOP opcode");
}

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
  try {  // what the pickle may reference, before anything is built from it
    caffe2::serialize::PyTorchStreamReader zip(std::make_shared<BytesReader>(bytes));
    if (!zip.hasRecord("data.pkl")) throw std::runtime_error("the archive has no data.pkl");
    auto [data, size] = zip.getRecord("data.pkl");
    check_pickle(static_cast<const char*>(data.get()), size, path);
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    if (what.rfind(path + ": ", 0) == 0) throw;
    throw std::runtime_error(path + ": not a torch.save zip archive: " + what.substr(0, 400));
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": not a torch.save zip archive: " + std::string(e.what()).substr(0, 400));
  }
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
