#include "mod/method_registry.h"

#include <algorithm>
#include <stdexcept>

#include "mod/token_selection.h"

namespace gmod {

// The anchors of the built-in methods (see the header: a static library's registration objects must be referenced).
extern int gmod_method_link_gamma_shared, gmod_method_link_per_layer, gmod_method_link_attention,
    gmod_method_link_fastv, gmod_method_link_pmod, gmod_method_link_pdrop;

namespace {
std::vector<std::unique_ptr<TokenSelector>>& table() {
  static std::vector<std::unique_ptr<TokenSelector>> t;
  return t;
}
}  // namespace

// An external array of the anchors' addresses: its relocations make the linker take every method's object whenever
// this one (needed by every MoD layer) is taken. A new method adds its anchor here.
extern int* const gmod_builtin_method_anchors[];
int* const gmod_builtin_method_anchors[] = {&gmod_method_link_gamma_shared, &gmod_method_link_per_layer,
                                            &gmod_method_link_attention,    &gmod_method_link_fastv,
                                            &gmod_method_link_pmod,         &gmod_method_link_pdrop};

MethodRegistration::MethodRegistration(std::unique_ptr<TokenSelector> method) {
  for (const auto& m : table())
    if (m->kind() == method->kind() || std::string(m->name()) == method->name())
      throw std::logic_error(std::string("MoD method \"") + method->name() + "\" registered twice");
  table().push_back(std::move(method));
}

std::vector<const TokenSelector*> registered_methods() {
  std::vector<const TokenSelector*> out;
  for (const auto& m : table()) out.push_back(m.get());
  std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->kind() < b->kind(); });
  return out;
}

const TokenSelector& method_for(RouterKind kind) {
  for (const auto& m : table())
    if (m->kind() == kind) return *m;
  throw std::logic_error("no MoD method registered for router \"" + to_string(kind) +
                         "\" (is its mod/select_*.cpp linked? see mod/method_registry.h)");
}

const TokenSelector* find_method(const std::string& name) {
  for (const auto& m : table())
    if (name == m->name()) return m.get();
  return nullptr;
}

const TokenSelector* method_for_rule(const std::string& rule) {
  for (const TokenSelector* m : registered_methods())
    if (m->owns_rule(rule)) return m;
  return nullptr;
}

std::string default_method_name() { return to_string(MoDConfig{}.router); }

const TokenSelector& method_named(const std::string& name, const std::string& source) {
  return method_for(router_kind(name, source));
}

}  // namespace gmod
