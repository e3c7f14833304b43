// `gmod answer`: batched answering of a benchmark question file with a dense or γ-MoD model, writing the
// answer file LLaVA's llava/eval/model_vqa_loader.py writes (one JSON object per line: question_id, prompt,
// text, answer_id, model_id, metadata), so `gmod score` and the original scoring scripts read it unchanged
// (docs/eval.md); the other formats of eval/questions.h likewise, and a stats file of what answering cost
// (tokens, skip ratios, TFLOPs, time). Greedy by default, top-p sampling on request; --num-chunks/--chunk-idx
// split the questions as LLaVA's scripts do (contiguous chunks, concatenated in chunk order afterwards).
#include <torch/torch.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>

#include "data/image.h"
#include "eval/pystr.h"
#include "eval/questions.h"
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

// A question with what the model reads: its prompt tokens and image pixels.
struct Question {
  eval::Question q;
  Prompt tokens;              // the template's prompt tokens
  PromptImages image;         // its pixels (and grid) through the model's image preparer, when it has an image
  std::string answer;         // the stripped answer
  std::string problem;        // why it could not be asked (then written with an empty answer)
};

// Prefill and decode time of the generate calls (GenerateResult's timing, mod/generate.h), summed over the
// batches: the next-token time is decode_seconds / decode_steps (one decode step gives each unfinished sample of
// its batch its next token). kv_bytes: the K/V bytes held after each prefill (GenerateResult::prefill_kv_bytes),
// summed over the batches.
struct GenerateTiming {
  std::optional<double> prefill_seconds, decode_seconds;
  std::optional<int64_t> decode_steps, kv_bytes;
};
void add_timing(const GenerateResult& r, GenerateTiming* t) {
  t->prefill_seconds = t->prefill_seconds.value_or(0) + r.prefill_seconds;
  t->decode_seconds = t->decode_seconds.value_or(0) + r.decode_seconds;
  t->decode_steps = t->decode_steps.value_or(0) + r.decode_steps;
  t->kv_bytes = t->kv_bytes.value_or(0) + r.prefill_kv_bytes;
}

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
  bool ignore_eos = false;  // every answer max_new_tokens long (timing runs: the same work for every model)
  std::string stats;  // "" = beside the answers; "-" = none
};

// What one process answered: the answer lines in question order, problems, and figures for the summary.
struct Answered {
  std::vector<std::string> lines;  // one answer record each (JSON, one line)
  std::vector<eval::Problem> problems;
  size_t answered = 0, asked = 0;
  int64_t generated = 0, prompt_tokens = 0;
  ComputeReport compute;
  GenerateTiming timing;
  double load_seconds = 0;
  bool greedy = true;
};

Answered answer_chunk(const AnswerCliOptions& o, int chunk_idx, int num_chunks) {
  const auto t0 = std::chrono::steady_clock::now();
  CliModel m = load_cli_model(o.model);
  auto tok = load_cli_tokenizer(o.text, m);
  DatasetConfig dc = cli_dataset_config(o.text, m, tok);
  if (!o.system.empty()) dc.conversation.system_prompt = o.system;
  ConversationEncoder enc(tok, dc.conversation);
  const std::string model_id =
      o.model_id.empty() ? std::filesystem::path(o.model.model).filename().string() : o.model_id;
  const int positions = m.model->config.text.max_position_embeddings;

  Answered res;
  res.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<eval::Problem>& problems = res.problems;
  const eval::QuestionFormat format = eval::question_format(o.format, o.questions);
  // MME's image paths are relative to the release folder itself, the others' to the question file's folder
  const std::string image_dir = !o.images.empty() ? o.images
                                : format == eval::QuestionFormat::kMme
                                    ? o.questions
                                    : std::filesystem::path(o.questions).parent_path().string();
  // Problems of reading the file are the same in every chunk: the first chunk names them.
  std::vector<eval::Problem> read_problems;
  std::vector<eval::Question> all =
      eval::read_questions(o.questions, format, o.single_pred_prompt, &read_problems);
  if (chunk_idx == 0) problems = read_problems;
  // LLaVA's get_chunk: chunks of ceil(n / num_chunks) questions; chunk k may be empty.
  const size_t n = all.size();
  const size_t chunk = static_cast<size_t>(std::ceil(static_cast<double>(n) / num_chunks));
  const size_t begin = std::min(n, chunk * static_cast<size_t>(chunk_idx)), end = std::min(n, begin + chunk);

  std::vector<Question> qs;   // the chunk's questions in order
  std::vector<size_t> asked;  // those that can be asked
  for (size_t i = begin; i < end; ++i) {
    Question q;
    q.q = std::move(all[i]);
    const std::string& where = q.q.where;
    try {
      if (!q.q.image.empty()) {
        if (!m.model->vision)
          throw std::invalid_argument("has an image but the model has no vision tower");
        q.image = prepare_prompt_images(
            *dc.image_preparer,
            {q.q.image_bytes.empty()
                 ? decode_image_file(image_dir + "/" + q.q.image)
                 : decode_image_memory(reinterpret_cast<const uint8_t*>(q.q.image_bytes.data()),
                                       q.q.image_bytes.size(), where)},
            dc.image.crop);
        q.q.image_bytes.clear();
      }
      q.tokens = build_prompt(enc, q.q.text, q.q.image.empty() ? 0 : 1, where, q.image.spans);
      if (static_cast<int64_t>(q.tokens.ids.size()) + o.max_new_tokens > positions)
        throw std::invalid_argument("prompt of " + std::to_string(q.tokens.ids.size()) + " tokens plus " +
                                    std::to_string(o.max_new_tokens) + " new ones is beyond the model's " +
                                    std::to_string(positions) + " positions");
      asked.push_back(qs.size());
      res.prompt_tokens += static_cast<int64_t>(q.tokens.ids.size());
    } catch (const std::exception& e) {
      problems.push_back({where, e.what()});
      q.problem = e.what();
    }
    qs.push_back(std::move(q));
  }

  GenerateOptions g = cli::sampling_options(o, enc.end_of_turn_id(), enc.pad_id());
  const int64_t eos = g.eos_token_id;  // the answer text ends there, also when generation goes on past it
  if (o.ignore_eos) g.eos_token_id = -1;

  ComputeReport& compute = res.compute;
  int64_t& generated = res.generated;
  res.greedy = g.greedy;
  for (size_t b0 = 0; b0 < asked.size(); b0 += o.batch) {
    const size_t b1 = std::min(asked.size(), b0 + static_cast<size_t>(o.batch));
    const int64_t B = static_cast<int64_t>(b1 - b0);
    int64_t L = 0;
    std::vector<at::Tensor> pixels, grids, sizes;  // images in sample order
    for (size_t i = b0; i < b1; ++i) {
      const Question& q = qs[asked[i]];
      L = std::max<int64_t>(L, static_cast<int64_t>(q.tokens.ids.size()));
      if (q.q.image.empty()) continue;
      pixels.push_back(q.image.pixel_values);
      if (q.image.image_grid_thw.defined()) grids.push_back(q.image.image_grid_thw);
      if (q.image.image_sizes.defined()) sizes.push_back(q.image.image_sizes);  // AnyRes
    }
    ModelInputs in;  // right-padded batch, images in sample order
    in.input_ids = at::full({B, L}, static_cast<int64_t>(enc.pad_id()), at::kLong);
    in.attention_mask = at::zeros({B, L}, at::kBool);
    in.token_roles = at::full({B, L}, static_cast<int64_t>(TokenRole::kPad), at::kChar);
    for (size_t i = b0; i < b1; ++i) {
      const Question& q = qs[asked[i]];
      const Prompt& p = q.tokens;
      const int64_t row = static_cast<int64_t>(i - b0), len = static_cast<int64_t>(p.ids.size());
      for (int64_t t = 0; t < len; ++t) {
        in.input_ids[row][t] = static_cast<int64_t>(p.ids[t]);
        in.token_roles[row][t] = static_cast<int64_t>(p.roles[t]);
      }
      in.attention_mask[row].slice(0, 0, len).fill_(true);
    }
    in.input_ids = in.input_ids.to(m.device);
    in.attention_mask = in.attention_mask.to(m.device);
    in.token_roles = in.token_roles.to(m.device);
    if (!pixels.empty()) in.pixel_values = at::cat(pixels).to(m.device, m.dtype);
    if (!grids.empty()) in.image_grid_thw = at::cat(grids).to(m.device);
    if (!sizes.empty()) in.image_sizes = at::cat(sizes);  // on the host: the packing reads it there
    const GenerateResult r = generate(*m.model, in, g);
    compute.add(r.compute);
    add_timing(r, &res.timing);
    const at::Tensor tokens = r.tokens.cpu(), lengths = r.lengths.cpu();
    for (int64_t row = 0; row < B; ++row) {
      std::vector<int32_t> ids;
      const int64_t len = lengths[row].item<int64_t>();
      generated += len;
      for (int64_t t = 0; t < len; ++t) {
        const auto id = static_cast<int32_t>(tokens[row][t].item<int64_t>());
        if (eos >= 0 && id == eos) break;
        ids.push_back(id);
      }
      qs[asked[b0 + static_cast<size_t>(row)]].answer = eval::py::strip(tok->decode(ids));
    }
  }
  for (size_t i = 0; i < qs.size(); ++i)
    res.lines.push_back(eval::answer_record(qs[i].q, format, qs[i].answer,
                                            model_id + "-" + std::to_string(begin + i), model_id,
                                            qs[i].problem)
                            .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  res.answered = asked.size();
  res.asked = end - begin;
  return res;
}

// The figures of one chunk that add up over ranks, as text for the gather.
std::string counts_text(const Answered& a) {
  const ComputeReport& c = a.compute;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%zu %zu %lld %lld %lld %lld %lld %lld %.17g %.17g %.17g %.17g %lld %lld",
                a.answered, a.asked, static_cast<long long>(a.generated),
                static_cast<long long>(a.prompt_tokens), static_cast<long long>(c.processed),
                static_cast<long long>(c.total), static_cast<long long>(c.mod_processed),
                static_cast<long long>(c.mod_total), c.flops, c.dense_flops,
                a.timing.prefill_seconds.value_or(NAN), a.timing.decode_seconds.value_or(NAN),
                static_cast<long long>(a.timing.decode_steps.value_or(-1)),
                static_cast<long long>(a.timing.kv_bytes.value_or(-1)));
  return buf;
}

// Adds another rank's counts_text to `a` (a timing absent on any rank is absent in the sum).
void add_counts(const std::string& text, bool first, Answered* a) {
  size_t answered = 0, asked = 0;
  long long gen = 0, prompt = 0, proc = 0, total = 0, mproc = 0, mtotal = 0, dtok = -1, kv = -1;
  double flops = 0, dense = 0, pre = NAN, dec = NAN;
  if (std::sscanf(text.c_str(), "%zu %zu %lld %lld %lld %lld %lld %lld %lg %lg %lg %lg %lld %lld", &answered,
                  &asked, &gen, &prompt, &proc, &total, &mproc, &mtotal, &flops, &dense, &pre, &dec, &dtok,
                  &kv) != 14)
    throw std::runtime_error("gmod answer: a rank sent unreadable counts '" + text + "'");
  a->answered += answered, a->asked += asked, a->generated += gen, a->prompt_tokens += prompt;
  ComputeReport& c = a->compute;
  c.processed += proc, c.total += total, c.mod_processed += mproc, c.mod_total += mtotal;
  c.flops += flops, c.dense_flops += dense;
  GenerateTiming& t = a->timing;
  // A rank that generated nothing (no questions) has no timing: it adds nothing rather than voiding the sum.
  auto sum = [first](auto& acc, auto v, bool measured) {
    if (first) acc.reset();
    if (measured) acc = acc.value_or(0) + v;
  };
  sum(t.prefill_seconds, pre, !std::isnan(pre));
  sum(t.decode_seconds, dec, !std::isnan(dec));
  sum(t.decode_steps, static_cast<int64_t>(dtok), dtok >= 0);
  sum(t.kv_bytes, static_cast<int64_t>(kv), kv >= 0);
}

std::string stats_path(const AnswerCliOptions& o) {
  if (!o.stats.empty()) return o.stats;
  std::filesystem::path p(o.answers);
  return (p.parent_path() / (p.stem().string() + ".stats.json")).string();
}

// What answering cost (docs/eval.md): samples, tokens, skip ratios, FLOPs, time.
eval::Json stats_json(const AnswerCliOptions& o, const Answered& res, eval::QuestionFormat format, int world,
                      double seconds) {
  const ComputeReport& c = res.compute;
  const double n = static_cast<double>(res.answered);
  auto opt = [](const auto& v) { return v ? eval::Json(*v) : eval::Json(); };
  eval::Json j = {{"questions", o.questions},
                  {"format", eval::format_name(format)},
                  {"answers", o.answers},
                  {"model", o.model.model},
                  {"ranks", world},
                  {"batch", o.batch},
                  {"max_new_tokens", o.max_new_tokens},
                  {"greedy", res.greedy},
                  {"asked", res.asked},
                  {"samples", res.answered},
                  {"problems", res.problems.size()},
                  {"prompt_tokens", res.prompt_tokens},
                  {"generated_tokens", res.generated},
                  {"layer_tokens", c.total},
                  {"processed_layer_tokens", c.processed},
                  {"mod_layer_tokens", c.mod_total},
                  {"processed_mod_layer_tokens", c.mod_processed},
                  {"skip_ratio", c.skip_ratio()},
                  {"skip_ratio_mod_layers", c.mod_skip_ratio()},
                  {"flops", c.flops},
                  {"dense_flops", c.dense_flops},
                  {"flop_ratio", c.flop_ratio()},
                  {"tflops_per_sample", n > 0 ? eval::Json(c.flops / n / 1e12) : eval::Json()},
                  {"dense_tflops_per_sample", n > 0 ? eval::Json(c.dense_flops / n / 1e12) : eval::Json()},
                  {"load_seconds", res.load_seconds},
                  {"wall_seconds", seconds},
                  {"samples_per_second", seconds > 0 ? eval::Json(n / seconds) : eval::Json()},
                  {"prefill_seconds", opt(res.timing.prefill_seconds)},
                  {"decode_seconds", opt(res.timing.decode_seconds)},
                  {"decode_steps", opt(res.timing.decode_steps)},
                  {"ignore_eos", o.ignore_eos},
                  {"kv_cache_bytes", opt(res.timing.kv_bytes)}};
  return j;
}

// Answers the chunk of this process (or, under mpirun, rank r of w answers chunk r of w and rank 0 writes the
// chunks in rank order) and writes the answer file and its stats.
int run_answer(const AnswerCliOptions& o, int rank, int world) {
  const int chunk_idx = world > 1 ? rank : o.chunk_idx, num_chunks = world > 1 ? world : o.num_chunks;
  const eval::QuestionFormat format = eval::question_format(o.format, o.questions);
  const auto t0 = std::chrono::steady_clock::now();
  Answered res = answer_chunk(o, chunk_idx, num_chunks);
  if (world > 1) {
    // Ranks wait here for the slowest one (a failing rank ends the job through run_guarded instead).
    set_collective_timeout(7 * 24 * 3600.0);
    std::string mine;
    for (const std::string& l : res.lines) mine += l + "\n";
    const std::vector<std::string> lines = all_gather_strings(mine, "answer lines (MPI_Iallgatherv)");
    std::string probs;
    for (const auto& p : res.problems) probs += p.where + '\t' + p.what + '\n';
    const std::vector<std::string> all_probs = all_gather_strings(probs, "answer problems (MPI_Iallgatherv)");
    const std::vector<std::string> counts =
        all_gather_strings(counts_text(res), "answer counts (MPI_Iallgatherv)");
    if (rank != 0) return kExitOk;
    res.lines.clear(), res.problems.clear(), res.answered = res.asked = 0,
                                             res.generated = res.prompt_tokens = 0;
    res.compute = ComputeReport();
    for (int r = 0; r < world; ++r) {
      for (const std::string& l : eval::py::split(lines[size_t(r)], "\n"))
        if (!l.empty()) res.lines.push_back(l);
      for (const std::string& l : eval::py::split(all_probs[size_t(r)], "\n"))
        if (const size_t tab = l.find('\t'); tab != std::string::npos)
          res.problems.push_back({l.substr(0, tab), l.substr(tab + 1)});
      add_counts(counts[size_t(r)], r == 0, &res);
    }
  }
  // MMMU's scripts read a JSON list (output.json); a .jsonl name gets JSON lines (gmod score reads both).
  const bool list =
      format == eval::QuestionFormat::kMmmu && std::filesystem::path(o.answers).extension() == ".json";
  std::string text;
  for (size_t i = 0; i < res.lines.size(); ++i)
    text += list ? (i ? ",\n" : "[\n") + res.lines[i] : res.lines[i] + "\n";
  if (list) text += res.lines.empty() ? "[]\n" : "\n]\n";
  std::ofstream out(o.answers);
  if (!(out << text)) throw std::runtime_error(o.answers + ": cannot write");
  out.close();
  std::vector<eval::Problem>& problems = res.problems;
  const ComputeReport& compute = res.compute;
  // after loading the model, until every rank's answers are here
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - res.load_seconds;
  std::printf("answered %zu of %zu questions (%s) in %.2f s, %lld tokens generated (%s); wrote %s\n",
              res.answered, res.asked,
              (world > 1 ? std::to_string(world) + " ranks"
                         : "chunk " + std::to_string(chunk_idx) + " of " + std::to_string(num_chunks))
                  .c_str(),
              secs, static_cast<long long>(res.generated), res.greedy ? "greedy" : "top-p sampling",
              o.answers.c_str());
  if (compute.mod_total > 0)
    std::printf("skip ratio: MoD layers %.4f, all layers %.4f; FLOPs vs dense %.4f\n",
                compute.mod_skip_ratio(), compute.skip_ratio(), compute.flop_ratio());
  if (o.stats != "-") {
    const std::string path = stats_path(o);
    std::ofstream f(path);
    if (!(f << stats_json(o, res, format, world, secs).dump(2) << "\n"))
      throw std::runtime_error(path + ": cannot write");
    std::printf("wrote %s\n", path.c_str());
  }
  eval::sort_problems(&problems);
  for (const auto& p : problems) std::cout << "  " << p.where << ": " << p.what << "\n";
  if (!problems.empty() && !o.allow_problems) {
    std::cerr << "gmod answer: " << problems.size()
              << " question(s) not answered (named above; those with an id are in the answer file with an "
                 "empty answer and the problem in metadata.problem)\n";
    return kExitRuntime;
  }
  return kExitOk;
}

Runner setup_answer(CLI::App& app) {
  auto o = std::make_shared<AnswerCliOptions>();
  add_model_options(app, o->model);
  add_text_options(app, o->text, /*with_max_len=*/false);
  add(app, "--questions", o->questions,
      "question file (LLaVA's jsonl: question_id, image, text; or see --format)")
      ->type_name("FILE")
      ->required();
  add(app, "--format", o->format,
      "question file: loader (model_vqa_loader's jsonl), science (model_vqa_science's json list), mmbench "
      "(MMBench's TSV), mme (MME's release folder), mmmu (MMMU's samples, JSON list or lines) or auto (a "
      "folder "
      "is mme, .tsv mmbench, a JSON list science, else loader)")
      ->check(CLI::IsMember({"auto", "loader", "science", "mmbench", "mme", "mmmu"}));
  add_flag(
      app, "--single-pred-prompt", o->single_pred_prompt,
      "append \"Answer with the option's letter from the given choices directly.\" (LLaVA's ScienceQA runs)");
  add(app, "--images", o->images,
      "image folder (default: the question file's folder; MME: the release folder)")
      ->type_name("DIR");
  add(app, "--answers", o->answers, "answer jsonl to write (MMMU: a .json name gets MMMU's output.json list)")
      ->type_name("FILE")
      ->required();
  add(app, "--stats", o->stats,
      "cost figures as JSON: samples, tokens, skip ratios, TFLOPs, time (default: ANSWERS_STEM.stats.json "
      "beside "
      "the answers; - = none)")
      ->type_name("FILE");
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
  add_flag(app, "--ignore-eos", o->ignore_eos,
           "generate --max-new-tokens for every question, past EOS (timing runs: every model does the same "
           "work; the answer text still ends at EOS)");
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

Register reg_answer({"answer",
                     "answer a benchmark question file (LLaVA's jsonl) into the answer file the scorers read",
                     setup_answer});

}  // namespace
}  // namespace gmod::cli
