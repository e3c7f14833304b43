// serve/chat_request.h: base64 against RFC 4648's test vectors, and the parser's answers to good and bad
// bodies (each bad body an ApiError with HTTP 400 naming the field).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "serve/chat_request.h"
#include "tests/common/paths.h"

namespace gmod::serve {
namespace {

std::string str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

TEST(Base64, Rfc4648Vectors) {
  EXPECT_EQ(str(decode_base64("")), "");
  EXPECT_EQ(str(decode_base64("Zg==")), "f");
  EXPECT_EQ(str(decode_base64("Zm8=")), "fo");
  EXPECT_EQ(str(decode_base64("Zm9v")), "foo");
  EXPECT_EQ(str(decode_base64("Zm9vYg==")), "foob");
  EXPECT_EQ(str(decode_base64("Zm9vYmE=")), "fooba");
  EXPECT_EQ(str(decode_base64("Zm9vYmFy")), "foobar");
  EXPECT_THROW(decode_base64("Zm9v!"), std::invalid_argument);
  EXPECT_THROW(decode_base64("Z"), std::invalid_argument);
  EXPECT_THROW(decode_base64("Zg==="), std::invalid_argument);
}

TEST(ChatRequest, ParsesTextImageAndOptions) {
  const ChatRequest r =
      parse_chat_request(R"({"model": "m", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
      "stop": ["x", "y"], "seed": 7, "stream": true, "messages": [{"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,Zm9v"}},
                                   {"type": "text", "text": "what?"}]}]})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].text, "<image>\nwhat?");
  ASSERT_EQ(r.images.size(), 1u);
  EXPECT_EQ(str(r.images[0].bytes), "foo");
  EXPECT_EQ(*r.max_tokens, 5);
  EXPECT_DOUBLE_EQ(*r.temperature, 0.5);
  EXPECT_DOUBLE_EQ(*r.top_p, 0.9);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(r.seed, 7u);
  EXPECT_TRUE(r.stream);
}

void expect_400(const std::string& body, const std::string& needle, const std::string& param = "") {
  try {
    parse_chat_request(body, RequestLimits{2, 16, {}});
    ADD_FAILURE() << "accepted: " << body;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    if (!param.empty()) {
      EXPECT_EQ(e.param, param) << e.what();
    }
    EXPECT_NE(e.to_json().find("\"invalid_request_error\""), std::string::npos);
  }
}

TEST(ChatRequest, BadBodiesAreHttp400NamingTheField) {
  const std::string user = R"({"role": "user", "content": "hi"})";
  expect_400("{\"messages\": [", "not valid JSON");
  expect_400("[1]", "must be a JSON object");
  expect_400(R"({"messages": [)" + user + R"(], "foo": 1})", "unknown field 'foo'", "foo");
  expect_400(R"({"model": "m"})", "'messages' is required", "messages");
  expect_400(R"({"messages": []})", "non-empty", "messages");
  expect_400(R"({"messages": [{"role": "tool", "content": "x"}]})", "role 'tool'", "messages[0].role");
  expect_400(R"({"messages": [{"role": "assistant", "content": "x"}]})", "at least one user message");
  expect_400(R"({"messages": [)" + user + R"(], "temperature": 3})", "[0, 2]", "temperature");
  expect_400(R"({"messages": [)" + user + R"(], "top_p": 0})", "(0, 1]", "top_p");
  expect_400(R"({"messages": [)" + user + R"(], "max_tokens": 0})", ">= 1", "max_tokens");
  expect_400(R"({"messages": [)" + user + R"(], "max_tokens": "5"})", "must be an integer", "max_tokens");
  expect_400(R"({"messages": [)" + user + R"(], "n": 2})", "'n' must be 1", "n");
  expect_400(R"({"messages": [)" + user + R"(], "stop": ["a","b","c","d","e"]})", "at most 4", "stop");
  const std::string part = R"({"role": "user", "content": [{"type": "image_url", "image_url": {"url": ")";
  expect_400(R"({"messages": [)" + part + R"(http://x/a.png"}}]}]})", "only base64 data URLs",
             "messages[0].content[0].image_url");
  expect_400(R"({"messages": [)" + part + R"(data:image/png;base64,@@@@"}}]}]})", "bad base64");
  expect_400(R"({"messages": [)" + part + R"(data:image/png;base64,)" + std::string(40, 'A') + R"("}}]}]})",
             "over the server's limit of 16 bytes");
  expect_400(R"({"messages": [{"role": "user", "content": [{"type": "audio", "audio": 1}]}]})",
             "'audio' is not served");
}

}  // namespace
}  // namespace gmod::serve

namespace gmod::serve {
namespace {

std::string image_body(const std::string& url) {
  return R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ")" + url +
         R"("}}]}]})";
}

// The error of parsing `url` as an image with `limits`; empty when it parsed.
std::string image_error(const std::string& url, const RequestLimits& limits) {
  try {
    parse_chat_request(image_body(url), limits);
    return {};
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.what();
    EXPECT_EQ(e.param, "messages[0].content[0].image_url");
    return e.what();
  }
}

TEST(ChatRequest, LocalImagePathsOnlyUnderTheAllowedFolder) {
  test::TempDir t;
  std::filesystem::create_directories(t.str("allowed/sub"));
  auto write = [](const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; };
  write(t.str("allowed/sub/a.png"), "PNGBYTES");
  write(t.str("secret.png"), "SECRET");
  std::filesystem::create_symlink(t.str("secret.png"), t.str("allowed/link.png"));

  RequestLimits none;  // no allowed folder: refused, saying how to allow
  EXPECT_NE(image_error(t.str("allowed/sub/a.png"), none).find("--allowed-image-dir"), std::string::npos);

  RequestLimits lim;
  lim.allowed_image_dir = t.str("allowed");
  for (const std::string& url :
       {t.str("allowed/sub/a.png"), "file://" + t.str("allowed/sub/a.png"), std::string("sub/a.png")}) {
    const ChatRequest r = parse_chat_request(image_body(url), lim);
    ASSERT_EQ(r.images.size(), 1u) << url;
    EXPECT_EQ(std::string(r.images[0].bytes.begin(), r.images[0].bytes.end()), "PNGBYTES") << url;
  }
  EXPECT_NE(image_error(t.str("secret.png"), lim).find("outside the allowed image folder"),
            std::string::npos);
  EXPECT_NE(image_error("file://" + t.str("secret.png"), lim).find("outside"), std::string::npos);
  EXPECT_NE(image_error(t.str("allowed/../secret.png"), lim).find("'..'"), std::string::npos);
  EXPECT_NE(image_error("sub/../../secret.png", lim).find("'..'"), std::string::npos);
  EXPECT_NE(image_error(t.str("allowed/link.png"), lim).find("symbolic link"), std::string::npos);
  EXPECT_NE(image_error(t.str("allowed/none.png"), lim).find("does not exist"), std::string::npos);
  lim.max_image_bytes = 4;
  EXPECT_NE(image_error("sub/a.png", lim).find("over the server's limit of 4 bytes"), std::string::npos);
}

TEST(ChatRequest, OpenAiFieldsNotImplementedPassOnlyWithTheirNeutralValue) {
  const std::string user = R"("messages": [{"role": "user", "content": "hi"}])";
  const ChatRequest r = parse_chat_request("{" + user + R"(, "user": "u1", "frequency_penalty": 0,
      "presence_penalty": 0.0, "logprobs": false, "response_format": {"type": "text"}, "stream": true,
      "stream_options": {"include_usage": true}})");
  EXPECT_TRUE(r.include_usage);
  expect_400("{" + user + R"(, "frequency_penalty": 0.5})", "not implemented", "frequency_penalty");
  expect_400("{" + user + R"(, "presence_penalty": 1})", "not implemented", "presence_penalty");
  expect_400("{" + user + R"(, "logprobs": true})", "not implemented", "logprobs");
  expect_400("{" + user + R"(, "response_format": {"type": "json_object"}})", "not implemented",
             "response_format");
  expect_400("{" + user + R"(, "stream_options": {"include_usage": true}})", "only allowed with stream",
             "stream_options");
  expect_400("{" + user + R"(, "tools": []})", "unknown field 'tools'", "tools");
}

}  // namespace
}  // namespace gmod::serve
