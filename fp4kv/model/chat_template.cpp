#include "fp4kv/model/chat_template.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "fp4kv/core/input_file.h"

namespace fp4kv::model {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kTokenizerConfig = "tokenizer_config.json";
constexpr const char* kTemplateFile = "chat_template.jinja";
constexpr const char* kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
constexpr const char* kReservedNames[] = {"messages", "tools", "documents", "add_generation_prompt"};

std::string read_text(const fs::path& path) {
  const std::optional<std::string> text = read_file(path.string());
  if (!text) throw Error("cannot read " + path.string());
  return *text;
}

// tokenizer_config.json's contents, or null when the directory has none.
json read_tokenizer_config(const std::string& dir) {
  const fs::path path = fs::path(dir) / kTokenizerConfig;
  if (!fs::is_regular_file(path)) return nullptr;
  json j = json::parse(read_text(path), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw Error(path.string() + " is not a JSON object");
  return j;
}

// A special token's text: a string, or an AddedToken object's "content"; empty when absent.
std::string token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

// transformers' special_tokens_map: the tokens that are set, by name.
jinja::Dict special_tokens(const json& config) {
  jinja::Dict out;
  if (!config.is_object()) return out;
  for (const char* name : kSpecialTokenNames)
    if (config.contains(name) && !token_text(config[name]).empty())
      out.emplace_back(name, jinja::Value::string(token_text(config[name])));
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    jinja::List tokens;
    for (const json& t : config["additional_special_tokens"])
      if (!token_text(t).empty()) tokens.push_back(jinja::Value::string(token_text(t)));
    if (!tokens.empty()) out.emplace_back("additional_special_tokens", jinja::Value::list(tokens));
  }
  return out;
}

// tokenizer_config.json's "chat_template": a string, or [{name, template}, ...] ("default").
std::optional<std::string> config_template(const json& config, const std::string& path) {
  if (!config.is_object() || !config.contains("chat_template") || config["chat_template"].is_null())
    return std::nullopt;
  const json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const json& named : t)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string())
        return named["template"].get<std::string>();
    throw Error(path + ": \"chat_template\" is a list of named templates without one named \"default\"");
  }
  throw Error(path + ": \"chat_template\" must be a string or a list of named templates, got " + t.type_name());
}

jinja::Value parse_variable(const std::string& text, const char* what, jinja::Value::Kind kind) {
  const jinja::Value v = jinja::json_value(text);
  if (!v.is(kind)) throw jinja::TemplateError(std::string(what) + " must be a JSON " + jinja::kind_name(kind));
  return v;
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, std::string origin, jinja::Dict special_tokens)
    : template_([&] {
        try {
          return jinja::Template(source);
        } catch (const jinja::TemplateError& e) {
          throw Error("the chat template of " + origin + " is not supported: " + e.what());
        }
      }()),
      origin_(std::move(origin)),
      special_tokens_(std::move(special_tokens)) {}

std::optional<ChatTemplate> ChatTemplate::for_model(const std::string& dir) {
  const json config = read_tokenizer_config(dir);
  const fs::path file = fs::path(dir) / kTemplateFile;
  if (fs::is_regular_file(file)) return ChatTemplate(read_text(file), file.string(), special_tokens(config));
  const std::string config_path = (fs::path(dir) / kTokenizerConfig).string();
  const std::optional<std::string> source = config_template(config, config_path);
  if (!source) return std::nullopt;
  return ChatTemplate(*source, config_path, special_tokens(config));
}

ChatTemplate ChatTemplate::from_file(const std::string& path, const std::string& model_dir) {
  if (!fs::is_regular_file(path)) throw Error("--chat-template " + path + ": no such file");
  return ChatTemplate(read_text(path), path, special_tokens(read_tokenizer_config(model_dir)));
}

std::string ChatTemplate::render(const ChatInput& input) const {
  jinja::Dict variables = special_tokens_;
  if (!input.variables_json.empty()) {
    const jinja::Value extra = parse_variable(input.variables_json, "the template variables", jinja::Value::Kind::dict);
    for (const auto& [name, value] : extra.entries()) {
      for (const char* reserved : kReservedNames)
        if (name == reserved) throw jinja::TemplateError("the template variable '" + name + "' cannot be set");
      jinja::set_entry(variables, name, value);
    }
  }
  variables.emplace_back("messages", parse_variable(input.messages_json, "messages", jinja::Value::Kind::list));
  variables.emplace_back("tools", input.tools_json.empty()
                                      ? jinja::Value::none()
                                      : parse_variable(input.tools_json, "tools", jinja::Value::Kind::list));
  variables.emplace_back("documents", jinja::Value::none());
  variables.emplace_back("add_generation_prompt", jinja::Value::boolean(input.add_generation_prompt));
  return template_.render(variables);
}

}  // namespace fp4kv::model
