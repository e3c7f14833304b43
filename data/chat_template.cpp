// ConversationConfig -> Jinja chat template: the same pieces as ConversationEncoder::encode (data/conversation.cpp)
// lays out, as text up to each answer.
#include "data/chat_template.h"

#include <nlohmann/json.hpp>

#include <stdexcept>

namespace gmod {
namespace {

// A literal as a Jinja expression (a JSON string is a valid Jinja string literal: the same escapes).
std::string lit(const std::string& s) { return "{{ " + nlohmann::json(s).dump() + " }}"; }

// The tokenizer's BOS, first, as the LLaMA-3 and Mistral templates write it (see the header for when).
const char* const kBos = "{{- bos_token -}}";

// text(m): a message's text (a string, or its text items joined). turn(m): the text a turn contributes, with its
// images as "<image>" placeholders, moved to the front as the encoder does with image_first.
std::string macros(bool image_first) {
  return std::string(
             "{%- macro text(m) -%}{%- if m['content'] is string -%}{{- m['content'] -}}{%- else -%}"
             "{%- for c in m['content'] if c['type'] == 'text' -%}{{- c['text'] -}}{%- endfor -%}{%- endif -%}"
             "{%- endmacro -%}"
             "{%- macro turn(m) -%}{%- set ns = namespace(text='', ordered='', images=0) -%}"
             "{%- if m['content'] is string -%}{%- set ns.text = m['content'] -%}{%- set ns.ordered = m['content'] -%}"
             "{%- else -%}{%- for c in m['content'] -%}"
             "{%- if c['type'] == 'image' -%}{%- set ns.images = ns.images + 1 -%}"
             "{%- set ns.ordered = ns.ordered + '<image>' -%}"
             "{%- elif c['type'] == 'text' -%}{%- set ns.text = ns.text + c['text'] -%}"
             "{%- set ns.ordered = ns.ordered + c['text'] -%}{%- endif -%}"
             "{%- endfor -%}{%- endif -%}"
             "{%- set n = ns.images + ns.text.count('<image>') -%}") +
         (image_first ? "{%- if n > 0 -%}{{- ('<image>\\n' * n + (ns.text.replace('<image>', '') | trim)) | trim -}}"
                        "{%- else -%}{{- ns.ordered -}}{%- endif -%}"
                      : "{{- ns.ordered -}}") +
         "{%- endmacro -%}";
}

// `system` = the first message's text when it is a system message, else the default; `turns` = the rest.
std::string split_system(const std::string& default_system) {
  return "{%- if messages and messages[0]['role'] == 'system' -%}{%- set system = text(messages[0]) -%}"
         "{%- set turns = messages[1:] -%}{%- else -%}{%- set system = " +
         nlohmann::json(default_system).dump() + " -%}{%- set turns = messages -%}{%- endif -%}";
}

std::string for_turns(const std::string& user, const std::string& assistant) {
  return "{%- for m in turns -%}{%- if m['role'] == 'user' -%}" + user + "{%- elif m['role'] == 'assistant' -%}" +
         assistant + "{%- endif -%}{%- endfor -%}";
}

}  // namespace

std::string hf_chat_template(const ConversationConfig& c, bool bos_first) {
  const std::string& t = c.template_name;
  if (!is_conversation_template(t) || t == "auto")
    throw std::invalid_argument("hf_chat_template: template '" + t + "' (expected " + conversation_template_list() +
                                ", resolved)");
  const std::string head = macros(c.image_first);
  const std::string bos = bos_first ? kBos : "";
  if (t == "vicuna_v1") {
    // SYSTEM " USER: q1 ASSISTANT:" " a1</s>" "USER: q2 ASSISTANT:" ...
    return head + split_system(c.system_prompt.value_or(kVicunaSystem)) + bos + "{{- system -}}" +
           for_turns("{%- if loop.first -%}" + lit(" ") + "{%- endif -%}" + lit("USER: ") + "{{- turn(m) -}}" +
                         lit(" ASSISTANT:"),
                     lit(" ") + "{{- turn(m) -}}" + lit("</s>"));
  }
  if (t == "plain") {
    // LLaVA's pretraining format: the image, then the caption; the question's text is not part of it.
    return head + "{%- set turns = messages | rejectattr('role', 'equalto', 'system') | list -%}" + bos +
           for_turns("{%- set ns = namespace(n=0) -%}{%- if m['content'] is string -%}"
                     "{%- set ns.n = m['content'].count('<image>') -%}{%- else -%}"
                     "{%- set ns.n = m['content'] | selectattr('type', 'equalto', 'image') | list | length -%}"
                     "{%- endif -%}{{- '<image>' * ns.n -}}",
                     "{{- turn(m) -}}" + lit("\n"));
  }
  if (t == "llama3" || t == "llama3_1") {
    // Every message stripped; a system block when there is something to say (3.1: always, with its date lines).
    const bool v31 = t == "llama3_1";
    return head + split_system(c.system_prompt.value_or(kLlama3System)) + "{%- set system = system | trim -%}" + bos +
           (v31 ? std::string("{%- if true -%}") : std::string("{%- if system -%}")) +
           lit(std::string("<|start_header_id|>system<|end_header_id|>\n\n") + (v31 ? kLlama31Preamble : "")) +
           "{{- system -}}" + lit("<|eot_id|>") + "{%- endif -%}" +
           for_turns(lit("<|start_header_id|>user<|end_header_id|>\n\n") + "{{- turn(m) | trim -}}" +
                         lit("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
                     "{{- turn(m) | trim -}}" + lit("<|eot_id|>"));
  }
  if (t == "mistral") {
    // "[INST] q1 [/INST]" a1 EOS ...; a system message goes before the first question ("SYSTEM\n\nq1").
    return head + split_system(c.system_prompt.value_or("")) + bos +
           for_turns(lit("[INST] ") + "{%- if loop.first and system -%}{{- system -}}" + lit("\n\n") +
                         "{%- endif -%}{{- turn(m) -}}" + lit(" [/INST]"),
                     "{{- turn(m) -}}{{- eos_token -}}");
  }
  const std::string rounds =
      for_turns(lit("<|im_start|>user\n") + "{{- turn(m) -}}" + lit("<|im_end|>\n<|im_start|>assistant\n"),
                "{{- turn(m) -}}" + lit("<|im_end|>\n"));
  const std::string system_block = lit("<|im_start|>system\n") + "{{- system -}}" + lit("<|im_end|>\n");
  if (t == "qwen3_vl")  // the system block only for a system message: the conversation's or the config's
    return head + split_system(c.system_prompt.value_or("")) +
           (c.system_prompt ? system_block
                            : "{%- if messages and messages[0]['role'] == 'system' -%}" + system_block +
                                  "{%- endif -%}") +
           rounds;
  // chatml, qwen2_5: "<|im_start|>system\nS<|im_end|>\n" then per round
  // "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n" a "<|im_end|>\n".
  return head + split_system(c.system_prompt.value_or(t == "qwen2_5" ? kQwen25System : kChatmlSystem)) +
         system_block + rounds;
}

}  // namespace gmod
