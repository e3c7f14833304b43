#include "serve/chat_request.h"

#include <climits>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace gmod::serve {

using nlohmann::json;

std::string ApiError::to_json() const {
  json e = {{"message", what()}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}}.dump();
}

namespace {

ApiError request_error(const std::string& message, const std::string& param = {}) {
  return ApiError(400, "invalid_request_error", message, param);
}

// The body's fields gmod reads; anything else is refused rather than silently ignored, as OpenAI's API does
// ("Unrecognized request argument"): a misspelt or unimplemented option must not pass unnoticed. The last
// five: OpenAI fields accepted only with their neutral value (harnesses send them explicitly).
const std::set<std::string> kKnownFields = {"model",
                                            "messages",
                                            "max_tokens",
                                            "max_completion_tokens",
                                            "temperature",
                                            "top_p",
                                            "stop",
                                            "seed",
                                            "stream",
                                            "stream_options",
                                            "n",
                                            "user",
                                            "logprobs",
                                            "frequency_penalty",
                                            "presence_penalty",
                                            "response_format"};

double number(const json& v, const std::string& name) {
  if (!v.is_number()) throw request_error("'" + name + "' must be a number, not " + v.dump(), name);
  const double x = v.get<double>();
  if (!std::isfinite(x)) throw request_error("'" + name + "' must be finite", name);
  return x;
}

int64_t integer(const json& v, const std::string& name) {
  if (!v.is_number_integer()) throw request_error("'" + name + "' must be an integer, not " + v.dump(), name);
  return v.get<int64_t>();
}

// A local image: file:///abs, /abs or relative to the allowed folder; refused unless its real path (links
// resolved) lies under the allowed folder's.
std::vector<uint8_t> local_image(const std::string& url, const std::string& param,
                                 const RequestLimits& limits) {
  std::string path = url.rfind("file://", 0) == 0 ? url.substr(7) : url;
  if (limits.allowed_image_dir.empty())
    throw request_error("local image paths are not served ('" + path +
                            "'): send a base64 data URL, or start gmod serve with --allowed-image-dir DIR",
                        param);
  for (size_t b = 0; b <= path.size();) {  // no '..' component, whatever the links would make of it
    const size_t e = std::min(path.find('/', b), path.size());
    if (path.compare(b, e - b, "..") == 0 && e - b == 2)
      throw request_error("image path '" + path + "' has a '..' component (refused)", param);
    b = e + 1;
  }
  char root[PATH_MAX], real[PATH_MAX];
  if (!realpath(limits.allowed_image_dir.c_str(), root))
    throw ApiError(500, "server_error",
                   "the allowed image folder '" + limits.allowed_image_dir + "' is gone");
  if (path.empty() || path[0] != '/') path = std::string(root) + "/" + path;
  const std::string under = std::string(root) + (std::string(root) == "/" ? "" : "/");
  if (path.rfind(under, 0) != 0)
    throw request_error(
        "image path '" + path + "' is outside the allowed image folder '" + limits.allowed_image_dir + "'",
        param);
  if (!realpath(path.c_str(), real))
    throw request_error("image path '" + path + "' does not exist under the allowed image folder", param);
  if (std::string(real).rfind(under, 0) != 0)
    throw request_error("image path '" + path + "' leads outside the allowed image folder '" +
                            limits.allowed_image_dir + "' (a symbolic link)",
                        param);
  std::ifstream f(real, std::ios::binary | std::ios::ate);
  if (!f) throw request_error("image path '" + path + "' is not a readable file", param);
  const std::streamoff size = f.tellg();
  if (size < 0) throw request_error("image path '" + path + "' is not a readable file", param);
  if (size_t(size) > limits.max_image_bytes)
    throw request_error("image file '" + path + "' of " + std::to_string(size) +
                            " bytes is over the server's limit of " + std::to_string(limits.max_image_bytes) +
                            " bytes",
                        param);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  f.seekg(0);
  if (!f.read(reinterpret_cast<char*>(bytes.data()), size))
    throw request_error("image path '" + path + "' could not be read", param);
  return bytes;
}

// "data:image/png;base64,...." -> the decoded bytes; a local path -> the file's bytes.
ChatImage image_part(const json& part, const std::string& where, const RequestLimits& limits) {
  const std::string param = where + ".image_url";
  if (!part.contains("image_url")) throw request_error("an image_url part needs 'image_url'", param);
  const json& iu = part["image_url"];
  std::string url;
  if (iu.is_string()) {
    url = iu.get<std::string>();
  } else if (iu.is_object() && iu.contains("url") && iu["url"].is_string()) {
    for (const auto& [k, _] : iu.items())
      if (k != "url" && k != "detail") throw request_error("unknown field '" + k + "' in image_url", param);
    url = iu["url"].get<std::string>();
  } else {
    throw request_error("'image_url' must be {\"url\": \"data:image/...;base64,...\"}", param);
  }
  if (url.rfind("file://", 0) == 0 || (url.find("://") == std::string::npos && url.rfind("data:", 0) != 0)) {
    ChatImage img;
    img.where = where;
    img.bytes = local_image(url, param, limits);
    return img;
  }
  const size_t comma = url.find(',');
  if (url.rfind("data:image/", 0) != 0 || comma == std::string::npos ||
      url.compare(comma - 7, 7, ";base64") != 0)
    throw request_error(
        "only base64 data URLs (data:image/png;base64,... or data:image/jpeg;base64,...) and local paths "
        "under "
        "--allowed-image-dir are served; got '" +
            url.substr(0, 40) + (url.size() > 40 ? "...'" : "'"),
        param);
  if ((url.size() - comma - 1) / 4 * 3 > limits.max_image_bytes)
    throw request_error("image of about " + std::to_string((url.size() - comma - 1) / 4 * 3) +
                            " bytes is over the server's limit of " + std::to_string(limits.max_image_bytes) +
                            " bytes",
                        param);
  ChatImage img;
  img.where = where;
  try {
    img.bytes = decode_base64(url.substr(comma + 1));
  } catch (const std::invalid_argument& e) {
    throw request_error(std::string("image data URL: ") + e.what(), param);
  }
  return img;
}

ChatMessage message(const json& m, size_t i, ChatRequest& req, const RequestLimits& limits) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) throw request_error(where + " must be an object", where);
  for (const auto& [k, _] : m.items())
    if (k != "role" && k != "content" && k != "name")
      throw request_error("unknown field '" + k + "' in " + where, where);
  if (!m.contains("role") || !m["role"].is_string())
    throw request_error(where + " needs a string 'role'", where + ".role");
  ChatMessage out;
  out.role = m["role"].get<std::string>();
  if (out.role == "developer") out.role = "system";
  if (out.role != "system" && out.role != "user" && out.role != "assistant")
    throw request_error(where + ": role '" + out.role + "' is not served (system, user, assistant)",
                        where + ".role");
  if (!m.contains("content")) throw request_error(where + " needs 'content'", where + ".content");
  const json& c = m["content"];
  if (c.is_string()) {
    out.text = c.get<std::string>();
    return out;
  }
  if (!c.is_array())
    throw request_error(where + ".content must be a string or a list of parts", where + ".content");
  bool last_text = false;
  for (size_t j = 0; j < c.size(); ++j) {
    const std::string pw = where + ".content[" + std::to_string(j) + "]";
    const json& part = c[j];
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw request_error(pw + " must be an object with a 'type'", pw);
    const std::string type = part["type"].get<std::string>();
    for (const auto& [k, _] : part.items())
      if (k != "type" && k != type) throw request_error("unknown field '" + k + "' in " + pw, pw);
    if (type == "text") {
      if (!part.contains("text") || !part["text"].is_string())
        throw request_error(pw + " needs a string 'text'", pw);
      out.text += (last_text ? "\n" : "") + part["text"].get<std::string>();
      last_text = true;
    } else if (type == "image_url") {
      if (out.role != "user") throw request_error(pw + ": images are served in user messages only", pw);
      if (req.images.size() >= limits.max_images)
        throw request_error("more than " + std::to_string(limits.max_images) + " images in one request", pw);
      req.images.push_back(image_part(part, pw, limits));
      out.text += "<image>\n";
      last_text = false;
    } else {
      throw request_error(pw + ": content part type '" + type + "' is not served (text, image_url)", pw);
    }
  }
  return out;
}

}  // namespace

std::vector<uint8_t> decode_base64(const std::string& text) {
  static const std::string kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t end = text.size();
  while (end > 0 && text[end - 1] == '=') --end;
  if (text.size() - end > 2) throw std::invalid_argument("bad base64 padding");
  for (size_t i = 0; i < end; ++i) {
    const size_t v = kAlphabet.find(text[i]);
    if (v == std::string::npos)
      throw std::invalid_argument("bad base64 character at offset " + std::to_string(i));
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>((acc >> bits) & 0xff));
    }
  }
  if (bits >= 6) throw std::invalid_argument("truncated base64 (length " + std::to_string(end) + ")");
  return out;
}

ChatRequest parse_chat_request(const std::string& body, const RequestLimits& limits) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    throw request_error(std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw request_error("the body must be a JSON object");
  for (const auto& [k, _] : j.items())
    if (!kKnownFields.count(k)) throw request_error("unknown field '" + k + "'", k);
  ChatRequest r;
  if (j.contains("model")) {
    if (!j["model"].is_string()) throw request_error("'model' must be a string", "model");
    r.model = j["model"].get<std::string>();
  }
  if (!j.contains("messages")) throw request_error("'messages' is required", "messages");
  const json& ms = j["messages"];
  if (!ms.is_array() || ms.empty()) throw request_error("'messages' must be a non-empty list", "messages");
  for (size_t i = 0; i < ms.size(); ++i) r.messages.push_back(message(ms[i], i, r, limits));
  for (const char* f : {"max_tokens", "max_completion_tokens"})
    if (j.contains(f) && !j[f].is_null()) {
      r.max_tokens = integer(j[f], f);
      if (*r.max_tokens < 1) throw request_error(std::string("'") + f + "' must be >= 1", f);
    }
  if (j.contains("temperature") && !j["temperature"].is_null()) {
    r.temperature = number(j["temperature"], "temperature");
    if (*r.temperature < 0 || *r.temperature > 2)
      throw request_error("'temperature' must be in [0, 2]", "temperature");
  }
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    r.top_p = number(j["top_p"], "top_p");
    if (!(*r.top_p > 0) || *r.top_p > 1) throw request_error("'top_p' must be in (0, 1]", "top_p");
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const json& x : s) {
        if (!x.is_string()) throw request_error("'stop' must hold strings", "stop");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      throw request_error("'stop' must be a string or a list of at most 4 strings", "stop");
    }
    for (const auto& x : r.stop)
      if (x.empty()) throw request_error("'stop' strings must not be empty", "stop");
  }
  if (j.contains("seed") && !j["seed"].is_null()) {
    const int64_t s = integer(j["seed"], "seed");
    if (s < 0) throw request_error("'seed' must be >= 0", "seed");
    r.seed = static_cast<uint64_t>(s);
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) throw request_error("'stream' must be true or false", "stream");
    r.stream = j["stream"].get<bool>();
  }
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const json& so = j["stream_options"];
    if (!r.stream)
      throw request_error("'stream_options' is only allowed with stream: true", "stream_options");
    if (!so.is_object()) throw request_error("'stream_options' must be an object", "stream_options");
    for (const auto& [k, v] : so.items()) {
      if (k != "include_usage" || !v.is_boolean())
        throw request_error("'stream_options' takes only include_usage: true or false", "stream_options");
      r.include_usage = v.get<bool>();
    }
  }
  if (j.contains("user") && !j["user"].is_null() && !j["user"].is_string())
    throw request_error("'user' must be a string", "user");
  for (const char* f : {"frequency_penalty", "presence_penalty"})
    if (j.contains(f) && !j[f].is_null() && !(j[f].is_number() && j[f].get<double>() == 0.0))
      throw request_error(std::string("'") + f + "' is not implemented by gmod serve (only 0 is accepted)",
                          f);
  if (j.contains("logprobs") && !j["logprobs"].is_null() && j["logprobs"] != false)
    throw request_error("'logprobs' is not implemented by gmod serve (only false is accepted)", "logprobs");
  if (j.contains("response_format") && !j["response_format"].is_null() &&
      j["response_format"] != json{{"type", "text"}})
    throw request_error("'response_format' other than {\"type\": \"text\"} is not implemented by gmod serve",
                        "response_format");
  if (j.contains("n") && !j["n"].is_null() && !(j["n"].is_number_integer() && j["n"].get<int64_t>() == 1))
    throw request_error("'n' must be 1 (one choice per request)", "n");
  bool user = false;
  for (const auto& m : r.messages) user = user || m.role == "user";
  if (!user) throw request_error("'messages' needs at least one user message", "messages");
  return r;
}

}  // namespace gmod::serve
