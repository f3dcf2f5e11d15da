// llamacpp_chat: a chat template rendered by llama.cpp's own Jinja engine (common/chat),
// as llama-server and llama-cli render it.
//
// Usage: llamacpp_chat TEMPLATE.jinja IN.jsonl OUT.jsonl [--bos TEXT] [--eos TEXT]
//   IN.jsonl: one conversation per line: {"messages":[...],"add_generation_prompt":bool}
//   and optionally "tools":[...] and "enable_thinking":bool (default true, as
//   llama-server's). Messages and tools are in OpenAI's chat shape, read by
//   llama-server's own reader (common_chat_msgs_parse_oaicompat: `tool_calls`,
//   `tool_call_id`, `reasoning_content` besides `role` and `content`).
//   OUT.jsonl: the same lines with "prompt", the rendered text. Default reasoning
//   settings. llama.cpp hands templates today's date as `date_string`; it is
//   fixed here to "26 Jul 2024" (the default the Llama 3.1 / 3.3 templates fall back to,
//   what an engine that passes no date renders) and the clock strftime_now reads to
//   that day, so the output does not depend on the day it was made.
// Built by llamacpp_run.sh (it links llama.cpp's common library for this one).

#include "chat.h"
#include "json.h"
#include "llama.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

using json = nlohmann::ordered_json;

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TEMPLATE.jinja IN.jsonl OUT.jsonl [--bos TEXT] [--eos TEXT]\n", argv[0]);
        return 2;
    }
    std::string bos, eos;
    for (int i = 4; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--bos") bos = argv[i + 1];
        else if (a == "--eos") eos = argv[i + 1];
        else {
            fprintf(stderr, "llamacpp_chat: unknown option %s\n", a.c_str());
            return 2;
        }
    }
    std::ifstream tf(argv[1]);
    if (!tf) {
        fprintf(stderr, "llamacpp_chat: cannot read %s\n", argv[1]);
        return 1;
    }
    std::stringstream ss;
    ss << tf.rdbuf();
    auto tmpls = common_chat_templates_init(nullptr, ss.str(), bos, eos);
    std::ifstream in(argv[2]);
    FILE *out = fopen(argv[3], "w");
    if (!in || !out) {
        fprintf(stderr, "llamacpp_chat: cannot read %s or write %s\n", argv[2], argv[3]);
        return 1;
    }
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        json obj = json::parse(line);
        common_chat_templates_inputs inputs;
        inputs.messages = common_chat_msgs_parse_oaicompat(common_json::parse(obj.at("messages").dump()));
        if (obj.contains("tools")) {
            inputs.tools = common_chat_tools_parse_oaicompat(common_json::parse(obj.at("tools").dump()));
        }
        inputs.add_generation_prompt = obj.value("add_generation_prompt", true);
        inputs.enable_thinking = obj.value("enable_thinking", true);
        inputs.use_jinja = true;
        inputs.now = std::chrono::system_clock::time_point(std::chrono::seconds(1721952000));
        inputs.chat_template_kwargs["date_string"] = "\"26 Jul 2024\"";
        const auto params = common_chat_templates_apply(tmpls.get(), inputs);
        obj["prompt"] = params.prompt;
        fprintf(out, "%s\n", obj.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
        n++;
    }
    fclose(out);
    fprintf(stderr, "llamacpp_chat: %d conversations rendered\n", n);
    return 0;
}
