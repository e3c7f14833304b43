// The MoD methods by name. Each method's file pair (mod/select_*.{h,cpp}) registers one TokenSelector
// (mod/token_selection.h) with GMOD_REGISTER_METHOD, as launch/cmd_*.cpp register their commands; the config's
// "router" value, the layers' behaviour and the checks outside mod/ are looked up here, so nothing outside mod/
// names a method.
//
// Linking: gmod::mod is a static library, and the linker only takes an object whose symbols something uses, so
// a registration object alone would be dropped. GMOD_REGISTER_METHOD also defines an anchor symbol
// gmod_method_link_<id>, and method_registry.cpp references every anchor (kBuiltinMethods there): a new method adds
// its anchor to that list once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mod/mod_config.h"

namespace gmod {

class TokenSelector;

struct MethodRegistration {
  explicit MethodRegistration(std::unique_ptr<TokenSelector> method);
};

#define GMOD_REGISTER_METHOD(id, Class)                          \
  int gmod_method_link_##id = 0;                                 \
  namespace {                                                    \
  const ::gmod::MethodRegistration registration_##id(std::make_unique<Class>()); \
  }

// Every registered method, in registration-independent order (by kind).
std::vector<const TokenSelector*> registered_methods();
// The method for a router kind; std::logic_error when none is registered (a method's object was not linked).
const TokenSelector& method_for(RouterKind kind);
// By registered name ("gamma_shared", "pmod", ...); nullptr when unknown.
const TokenSelector* find_method(const std::string& name);
// The method whose gmod convert rule `rule` is (TokenSelector::owns_rule); nullptr: a layer rule of
// mod/conversion.h.
const TokenSelector* method_for_rule(const std::string& rule);
// The method a MoD config names when it names none (MoDConfig's default router), by its registered name.
std::string default_method_name();
// By name, or std::invalid_argument naming `source` and the known names (as router_kind).
const TokenSelector& method_named(const std::string& name, const std::string& source);

}  // namespace gmod
