// `gmod answer`: batched answering of a benchmark question file with a dense or γ-MoD model, writing the
// answer file LLaVA's llava/eval/model_vqa_loader.py writes (one JSON object per line: question_id, prompt,
// text, answer_id, model_id, metadata), so `gmod score` and the original scoring scripts read it unchanged
// (docs/eval.md). Greedy by default, top-p sampling on request; --num-chunks/--chunk-idx split the questions
// as LLaVA's scripts do (contiguous chunks, concatenated in chunk order afterwards).
#include <torch/torch.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>

#include "data/clip_preprocess.h"
#include "data/image.h"
#include "eval/pystr.h"
#include "eval/records.h"
#include "launch/cli_model.h"
#include "launch/cli_prompt.h"
#include "launch/cli_sampling.h"
#include "mod/accounting.h"
#include "mod/generate.h"
#include "parallel/host_gather.h"
#include "parallel/runtime.h"
#include "parallel/watchdog.h"

namespace gmod::cli {
namespace {

struct AnswerCliOptions {
  ModelOptions model;
  TextOptions text;
  std::string questions, images, answers, model_id, system;
  int batch = 8;
  int64_t max_new_tokens = 128;
  std::optional<double> top_p, temperature;
  uint64_t seed = 0;
  int num_chunks = 1, chunk_idx = 0;
  bool allow_problems = false;
  std::string format = "auto";
  bool single_pred_prompt = false;
};

struct Question {
  eval::Json id;
  std::string text;    // what the model is asked (the image goes before it)
  std::string prompt;  // what the answer file records as "prompt" (as the original script writes it)
  std::string image, where;
  eval::Json options;         // MMBench: the options as asked (written with round_id and option_char)
  Prompt tokens;              // the template's prompt tokens
  std::vector<float> pixels;  // [3, S, S] when the question has an image
};

const char* const kLetterPrompt = "Answer with the option's letter from the given choices directly.";

bool is_json_list(const std::string& path) {
  std::ifstream f(path);
  char c = 0;
  while (f.get(c) && std::isspace(static_cast<unsigned char>(c))) {
  }
  return c == '[';
}

std::string base64_decode(const std::string& in, const std::string& where) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z')
      v = c - 'A';
    else if (c >= 'a' && c <= 'z')
      v = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      v = c - '0' + 52;
    else if (c == '+' || c == '-')
      v = 62;
    else if (c == '/' || c == '_')
      v = 63;
    else if (c == '=' || std::isspace(static_cast<unsigned char>(c)))
      continue;
    else
      throw std::invalid_argument(where + ": the image is not base64");
    acc = (acc << 6) | static_cast<uint32_t>(v), bits += 6;
    if (bits >= 8) bits -= 8, out += static_cast<char>((acc >> bits) & 0xFF);
  }
  return out;
}

// LLaVA's is_none for a TSV cell: missing (empty), "nan" or "none" in any case.
bool is_none(const std::string* cell) {
  if (!cell || cell->empty()) return true;
  const std::string l = eval::py::lower(*cell);
  return l == "nan" || l == "none";
}

// MMBench's TSV rows as question records {index, question (hint + question + "A. option" lines), options,
// image_base64}, as model_vqa_mmbench.py builds them (one round: options in the table's order).
std::vector<eval::Record> mmbench_records(const std::string& path, std::vector<eval::Problem>* problems) {
  std::vector<eval::Record> out;
  for (const eval::TsvRow& row : eval::read_tsv(path, problems)) {
    const std::string* idx = row.get("index");
    const std::string* question = row.get("question");
    char* end = nullptr;
    const long long index = idx ? std::strtoll(idx->c_str(), &end, 10) : 0;
    if (!idx || idx->empty() || *end || !question) {
      problems->push_back({row.where, "no integer 'index' or no 'question'"});
      continue;
    }
    std::string text = is_none(row.get("hint")) ? *question : *row.get("hint") + "\n" + *question;
    eval::Json options = eval::Json::array();
    for (const char* c : {"A", "B", "C", "D"}) {
      const std::string* o = row.get(c);
      if (is_none(o)) break;
      text += std::string("\n") + c + ". " + *o;
      options.push_back(*o);
    }
    eval::Json v = {{"index", index}, {"question", text}, {"options", options}};
    if (const std::string* img = row.get("image"); img && !img->empty()) v["image_base64"] = *img;
    out.push_back({std::move(v), row.where});
  }
  return out;
}

// One question record: model_vqa_loader's {question_id, image, text}, or (science) model_vqa_science's
// {id, image, conversations: [{value: question}, ...]} whose prompt drops "<image>" and records "<image>\n" +
// question when there is an image; --single-pred-prompt appends the letter instruction to both.
bool read_question(const eval::Record& r, bool science, bool single_pred, Question* q,
                   std::vector<eval::Problem>* problems) {
  if (r.value.contains(
          "index")) {  // an MMBench row (mmbench_records): the letter instruction is not recorded
    q->id = r.value["index"];
    q->text = q->prompt = r.value["question"].get<std::string>();
    q->options = r.value["options"];
    if (single_pred) q->text += std::string("\n") + kLetterPrompt;
    return true;
  }
  const auto id = r.value.find(science ? "id" : "question_id");
  if (id == r.value.end() || eval::id_key(*id).empty()) {
    problems->push_back(
        {r.where, std::string("no '") + (science ? "id" : "question_id") + "' (a string or a number)"});
    return false;
  }
  q->id = *id;
  if (science) {
    const eval::Json& conv = r.value.contains("conversations") ? r.value["conversations"] : eval::Json();
    if (!conv.is_array() || conv.empty() || !conv[0].is_object() || !conv[0].contains("value") ||
        !conv[0]["value"].is_string()) {
      problems->push_back({r.where, "no 'conversations' list whose first turn has a string 'value'"});
      return false;
    }
    q->text = eval::py::strip(eval::py::replace(conv[0]["value"].get<std::string>(), "<image>", ""));
    q->prompt = (r.value.contains("image") ? "<image>\n" : "") + q->text;
  } else {
    const std::string* text = eval::string_field(r, "text", problems);
    if (!text) return false;
    q->text = q->prompt = *text;
  }
  if (single_pred) {
    q->text += std::string("\n") + kLetterPrompt;
    q->prompt += std::string("\n") + kLetterPrompt;
  }
  return true;
}

// What one process answered: the answer lines in question order, problems, and figures for the summary.
struct Answered {
  std::string lines;
  std::vector<eval::Problem> problems;
  size_t answered = 0, asked = 0;
  int64_t generated = 0;
  ComputeReport compute;
  bool greedy = true;
};

Answered answer_chunk(const AnswerCliOptions& o, int chunk_idx, int num_chunks) {
  CliModel m = load_cli_model(o.model);
  auto tok = load_cli_tokenizer(o.text, m);
  DatasetConfig dc = cli_dataset_config(o.text, m);
  if (!o.system.empty()) dc.conversation.system_prompt = o.system;
  ConversationEncoder enc(tok, dc.conversation);
  const std::string image_dir =
      o.images.empty() ? std::filesystem::path(o.questions).parent_path().string() : o.images;
  const std::string model_id =
      o.model_id.empty() ? std::filesystem::path(o.model.model).filename().string() : o.model_id;
  const int positions = m.model->config.text.max_position_embeddings;

  Answered res;
  std::vector<eval::Problem>& problems = res.problems;
  const bool mmbench = o.format == "mmbench" || (o.format == "auto" && o.questions.size() > 4 &&
                                                 o.questions.compare(o.questions.size() - 4, 4, ".tsv") == 0);
  std::vector<eval::Record> records =
      mmbench ? mmbench_records(o.questions, &problems) : eval::read_records(o.questions, &problems);
  const bool science = o.format == "science" || (o.format == "auto" && is_json_list(o.questions));
  // LLaVA's get_chunk: chunks of ceil(n / num_chunks) questions; chunk k may be empty.
  const size_t n = records.size();
  const size_t chunk = static_cast<size_t>(std::ceil(static_cast<double>(n) / num_chunks));
  const size_t begin = std::min(n, chunk * static_cast<size_t>(chunk_idx)), end = std::min(n, begin + chunk);

  std::vector<Question> qs;
  for (size_t i = begin; i < end; ++i) {
    const eval::Record& r = records[i];
    Question q;
    q.where = r.where;
    if (!read_question(r, science, o.single_pred_prompt, &q, &problems)) continue;
    try {
      if (r.value.contains("image")) {
        if (!r.value["image"].is_string()) throw std::invalid_argument("'image' is not a string");
        if (!m.model->config.vision)
          throw std::invalid_argument("has an image but the model has no vision tower");
        q.image = r.value["image"].get<std::string>();
        q.pixels = clip_preprocess(decode_image_file(image_dir + "/" + q.image), dc.image);
      } else if (r.value.contains("image_base64")) {
        if (!m.model->config.vision)
          throw std::invalid_argument("has an image but the model has no vision tower");
        const std::string bytes = base64_decode(r.value["image_base64"].get<std::string>(), r.where);
        q.image = "base64";
        q.pixels = clip_preprocess(
            decode_image_memory(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), r.where),
            dc.image);
      }
      q.tokens = build_prompt(enc, q.text, q.image.empty() ? 0 : 1, r.where);
      if (static_cast<int64_t>(q.tokens.ids.size()) + o.max_new_tokens > positions)
        throw std::invalid_argument("prompt of " + std::to_string(q.tokens.ids.size()) + " tokens plus " +
                                    std::to_string(o.max_new_tokens) + " new ones is beyond the model's " +
                                    std::to_string(positions) + " positions");
    } catch (const std::exception& e) {
      problems.push_back({r.where, e.what()});
      continue;
    }
    qs.push_back(std::move(q));
  }

  const GenerateOptions g = cli::sampling_options(o, enc.end_of_turn_id(), enc.pad_id());

  ComputeReport& compute = res.compute;
  int64_t& generated = res.generated;
  res.greedy = g.greedy;
  const int S = dc.image.crop;
  for (size_t b0 = 0; b0 < qs.size(); b0 += o.batch) {
    const size_t b1 = std::min(qs.size(), b0 + static_cast<size_t>(o.batch));
    const int64_t B = static_cast<int64_t>(b1 - b0);
    int64_t L = 0, images = 0;
    for (size_t i = b0; i < b1; ++i) {
      L = std::max<int64_t>(L, static_cast<int64_t>(qs[i].tokens.ids.size()));
      images += !qs[i].image.empty();
    }
    ModelInputs in;  // right-padded batch, images in sample order
    in.input_ids = at::full({B, L}, static_cast<int64_t>(enc.pad_id()), at::kLong);
    in.attention_mask = at::zeros({B, L}, at::kBool);
    in.token_roles = at::full({B, L}, static_cast<int64_t>(TokenRole::kPad), at::kChar);
    if (images) in.pixel_values = at::empty({images, 3, S, S}, at::kFloat);
    int64_t img = 0;
    for (size_t i = b0; i < b1; ++i) {
      const Prompt& p = qs[i].tokens;
      const int64_t row = static_cast<int64_t>(i - b0), len = static_cast<int64_t>(p.ids.size());
      for (int64_t t = 0; t < len; ++t) {
        in.input_ids[row][t] = static_cast<int64_t>(p.ids[t]);
        in.token_roles[row][t] = static_cast<int64_t>(p.roles[t]);
      }
      in.attention_mask[row].slice(0, 0, len).fill_(true);
      if (!qs[i].image.empty())
        std::memcpy(in.pixel_values[img++].data_ptr<float>(), qs[i].pixels.data(),
                    qs[i].pixels.size() * sizeof(float));
    }
    in.input_ids = in.input_ids.to(m.device);
    in.attention_mask = in.attention_mask.to(m.device);
    in.token_roles = in.token_roles.to(m.device);
    if (images) in.pixel_values = in.pixel_values.to(m.device, m.dtype);
    const GenerateResult r = generate(*m.model, in, g);
    compute.add(r.compute);
    const at::Tensor tokens = r.tokens.cpu(), lengths = r.lengths.cpu();
    for (int64_t row = 0; row < B; ++row) {
      std::vector<int32_t> ids;
      const int64_t len = lengths[row].item<int64_t>();
      generated += len;
      for (int64_t t = 0; t < len; ++t) {
        const auto id = static_cast<int32_t>(tokens[row][t].item<int64_t>());
        if (g.eos_token_id >= 0 && id == g.eos_token_id) break;
        ids.push_back(id);
      }
      const Question& q = qs[b0 + static_cast<size_t>(row)];
      eval::Json rec = {{"question_id", q.id}};
      if (!q.options.is_null()) rec["round_id"] = 0;
      rec["prompt"] = q.prompt;
      rec["text"] = eval::py::strip(tok->decode(ids));
      if (!q.options.is_null()) {
        rec["options"] = q.options;
        rec["option_char"] = eval::Json::array();
        for (size_t k = 0; k < q.options.size(); ++k) rec["option_char"].push_back(std::string(1, "ABCD"[k]));
      }
      rec["answer_id"] = model_id + "-" + std::to_string(begin + b0 + static_cast<size_t>(row));
      rec["model_id"] = model_id;
      rec["metadata"] = eval::Json::object();
      res.lines += rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }
  }
  res.answered = qs.size();
  res.asked = end - begin;
  return res;
}

// Answers the chunk of this process (or, under mpirun, rank r of w answers chunk r of w and rank 0 writes the
// chunks in rank order) and writes the answer file.
int run_answer(const AnswerCliOptions& o, int rank, int world) {
  const int chunk_idx = world > 1 ? rank : o.chunk_idx, num_chunks = world > 1 ? world : o.num_chunks;
  const auto t0 = std::chrono::steady_clock::now();
  Answered res = answer_chunk(o, chunk_idx, num_chunks);
  if (world > 1) {
    // Ranks wait here for the slowest one (a failing rank ends the job through run_guarded instead).
    set_collective_timeout(7 * 24 * 3600.0);
    const std::vector<std::string> lines = all_gather_strings(res.lines, "answer lines (MPI_Iallgatherv)");
    std::string probs;
    for (const auto& p : res.problems) probs += p.where + '\t' + p.what + '\n';
    const std::vector<std::string> all_probs = all_gather_strings(probs, "answer problems (MPI_Iallgatherv)");
    const std::vector<std::string> counts = all_gather_strings(
        std::to_string(res.answered) + " " + std::to_string(res.asked) + " " + std::to_string(res.generated),
        "answer counts (MPI_Iallgatherv)");
    if (rank != 0) return kExitOk;
    res.lines.clear(), res.problems.clear(), res.answered = res.asked = 0, res.generated = 0;
    for (int r = 0; r < world; ++r) {
      res.lines += lines[size_t(r)];
      for (const std::string& l : eval::py::split(all_probs[size_t(r)], "\n"))
        if (const size_t tab = l.find('\t'); tab != std::string::npos)
          res.problems.push_back({l.substr(0, tab), l.substr(tab + 1)});
      size_t a = 0, q = 0;
      long long gen = 0;
      std::sscanf(counts[size_t(r)].c_str(), "%zu %zu %lld", &a, &q, &gen);
      res.answered += a, res.asked += q, res.generated += gen;
    }
  }
  std::ofstream out(o.answers);
  if (!(out << res.lines)) throw std::runtime_error(o.answers + ": cannot write");
  out.close();
  std::vector<eval::Problem>& problems = res.problems;
  const ComputeReport& compute = res.compute;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("answered %zu of %zu questions (%s) in %.2f s, %lld tokens generated (%s); wrote %s\n",
              res.answered, res.asked,
              (world > 1 ? std::to_string(world) + " ranks"
                         : "chunk " + std::to_string(chunk_idx) + " of " + std::to_string(num_chunks))
                  .c_str(),
              secs, static_cast<long long>(res.generated), res.greedy ? "greedy" : "top-p sampling",
              o.answers.c_str());
  if (compute.mod_total > 0 && world == 1)  // (under mpirun only rank 0's share would be known)
    std::printf("skip ratio: MoD layers %.4f, all layers %.4f; FLOPs vs dense %.4f\n",
                compute.mod_skip_ratio(), compute.skip_ratio(), compute.flop_ratio());
  eval::sort_problems(&problems);
  for (const auto& p : problems) std::cout << "  " << p.where << ": " << p.what << "\n";
  if (!problems.empty() && !o.allow_problems) {
    std::cerr << "gmod answer: " << problems.size() << " question(s) not answered (named above)\n";
    return kExitRuntime;
  }
  return kExitOk;
}

Runner setup(CLI::App& app) {
  auto o = std::make_shared<AnswerCliOptions>();
  add_model_options(app, o->model);
  add_text_options(app, o->text, /*with_max_len=*/false);
  add(app, "--questions", o->questions,
      "question jsonl (question_id, image, text), as LLaVA's model_vqa_loader reads")
      ->type_name("FILE")
      ->required();
  add(app, "--format", o->format,
      "question file: loader (model_vqa_loader's jsonl), science (model_vqa_science's json list) or auto (a "
      "JSON "
      "list is science)")
      ->check(CLI::IsMember({"auto", "loader", "science"}));
  add_flag(
      app, "--single-pred-prompt", o->single_pred_prompt,
      "append \"Answer with the option's letter from the given choices directly.\" (LLaVA's ScienceQA runs)");
  add(app, "--images", o->images, "image folder (default: the question file's folder)")->type_name("DIR");
  add(app, "--answers", o->answers, "answer jsonl to write")->type_name("FILE")->required();
  add(app, "--model-id", o->model_id, "model_id written with each answer (default: the model dir's name)");
  add(app, "--system", o->system, "system prompt (default: the template's)");
  add(app, "--batch", o->batch, "questions per generate batch")->check(positive());
  add(app, "--max-new-tokens", o->max_new_tokens, "tokens to generate at most per answer")->check(positive());
  add(app, "--top-p", o->top_p, "top-p sampling with this p (default: greedy)")
      ->type_name("P")
      ->check(between(0.0, 1.0));
  add(app, "--temperature", o->temperature, "sampling temperature (implies sampling)")
      ->type_name("T")
      ->check(positive());
  add(app, "--seed", o->seed, "sampling seed");
  add(app, "--num-chunks", o->num_chunks, "split the questions into this many contiguous chunks")
      ->check(positive());
  add(app, "--chunk-idx", o->chunk_idx, "the chunk this process answers (0-based)")->check(non_negative());
  add_flag(app, "--allow-problems", o->allow_problems,
           "exit 0 even when questions could not be answered (named)");
  return [o] {
    if (o->chunk_idx >= o->num_chunks)
      throw UsageError("--chunk-idx " + std::to_string(o->chunk_idx) + " must be below --num-chunks " +
                       std::to_string(o->num_chunks));
    // Under mpirun (more than one rank) the ranks split the questions; otherwise no MPI at all.
    const char* env = std::getenv("OMPI_COMM_WORLD_SIZE");
    if (!env) env = std::getenv("PMI_SIZE");
    if (!env || std::atoi(env) <= 1) return run_answer(*o, 0, 1);
    if (o->num_chunks > 1) throw UsageError("--num-chunks: under mpirun the ranks are the chunks");
    Runtime runtime(nullptr, nullptr);
    return run_guarded([&] { return run_answer(*o, world_rank(), world_size()); });
  };
}

Register reg({"answer",
              "answer a benchmark question file (LLaVA's jsonl) into the answer file the scorers read",
              setup});

}  // namespace
}  // namespace gmod::cli
