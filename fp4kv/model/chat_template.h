// A checkpoint's chat template: how a conversation (OpenAI-style messages) becomes the prompt
// text the model was trained on, exactly as transformers' apply_chat_template writes it (the
// template language: jinja.h). Found where transformers looks: <dir>/chat_template.jinja,
// else tokenizer_config.json's "chat_template" (a string, or a list of named templates, of
// which "default" is used). The special tokens of tokenizer_config.json (bos_token,
// eos_token, unk_token, pad_token, additional_special_tokens) are the template's variables, as
// transformers passes its special_tokens_map.
//
// Invariants: a template that does not parse is refused at load with the file's name;
// render() either returns the prompt text or throws jinja::TemplateError (the template's own
// raise_exception as jinja::RaisedError: the conversation is what it refuses).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fp4kv/model/jinja.h"

namespace fp4kv::model {

// What a conversation gives the template, as JSON texts.
struct ChatInput {
  std::string messages_json = "[]";  // a JSON array of message objects ({role, content, ...})
  std::string tools_json;            // a JSON array of tool definitions, or empty: none
  std::string variables_json;        // a JSON object of further variables (e.g. enable_thinking), or empty
  bool add_generation_prompt = true;
};

class ChatTemplate {
 public:
  // The checkpoint's template, or nullopt when it has none. Throws Error naming the file for
  // a template that does not parse or a tokenizer_config.json that is not valid JSON.
  static std::optional<ChatTemplate> for_model(const std::string& dir);
  // A template file given by the operator (serve --chat-template); the special tokens still
  // come from `model_dir`'s tokenizer_config.json when it has one.
  static ChatTemplate from_file(const std::string& path, const std::string& model_dir);
  ChatTemplate(const std::string& source, std::string origin, jinja::Dict special_tokens);

  // The prompt text; throws jinja::TemplateError. Names the template reserves (messages,
  // tools, documents, add_generation_prompt) cannot be set through variables_json.
  std::string render(const ChatInput& input) const;
  // Where the template came from (a file, or "tokenizer_config.json" of a directory).
  const std::string& origin() const { return origin_; }

 private:
  jinja::Template template_;
  std::string origin_;
  jinja::Dict special_tokens_;
};

}  // namespace fp4kv::model
