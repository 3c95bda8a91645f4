// Datasets: JSONL records and their batching. A record is one of
//   {"input_ids": [...], "labels": [...]}   token ids (labels optional; -100 = not trained)
//   {"text": "..."}                          tokenized (with the BOS), every token trained
//   {"prompt": "...", "completion": "..."}   tokenized; only the completion's tokens trained
//   {"messages": [{"role": ..., "content": ...}, ...]}
//                                            rendered with the model's chat template (chat.h),
//                                            tokenized; only the assistant turns trained
#pragma once
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

namespace sf {

constexpr int32_t kIgnoreIndex = -100;

struct Record {
  std::vector<int32_t> ids;     // input token ids
  std::vector<int32_t> labels;  // same length; -100 = not trained
};

struct Dataset {
  std::string path;
  std::vector<Record> records;
};

// The longest JSONL line (record) read: a line is read whole before it is parsed, so this bounds
// the memory one record can take (a record of token ids takes about 4 bytes per id beyond it).
constexpr size_t kDefaultMaxRecordBytes = size_t(64) << 20;
constexpr size_t kMaxMaxRecordBytes = size_t(1) << 32;  // the most --max-record-bytes may raise it to
// Process-wide (the --max-record-bytes option of the commands that read data); InputError naming
// the option outside [1, kMaxMaxRecordBytes].
void set_max_record_bytes(uint64_t bytes);
size_t max_record_bytes();

class Tokenizer;
struct ChatTemplate;

struct LoadOptions {
  // Loads the model's tokenizer (text, prompt/completion and chat records); an InputError when it
  // has none. Called at most once.
  std::function<const Tokenizer&()> tokenizer;
  // The model's chat template, or nullptr when it has none (chat records are then refused).
  std::function<const ChatTemplate*()> chat_template;
  bool train_on_all = false;  // chat records: every token trained, not only the assistant turns
  // A tokenized copy of the dataset next to the data file, "<data>.sf-cache-<key>.bin", keyed by
  // the file (size, mtime, its first and last MiB), the tokenizer and the template; read instead
  // of the data when valid.
  bool cache = true;
  std::time_t now = 0;  // what strftime_now formats in chat templates (0: the current time)
  int threads = 0;      // tokenization threads (0: usable_cpus())
  bool add_special = true;      // text and prompt records get the post-processor's tokens (a BOS)
  bool keep_chat_text = false;  // stream_jsonl: chat records keep their rendered text
};

// A record of a JSONL file as stream_jsonl hands it on.
struct LoadedRecord {
  enum Kind { Ids, Text, PromptCompletion, Chat };
  Kind kind = Ids;
  size_t line = 0;   // in the file (1-based)
  Record record;     // ids and labels (text: labels = ids; chat: -100 outside the assistant turns)
  std::string text;  // chat records with keep_chat_text: the rendered conversation
  std::string out;   // what stream_jsonl's `format` made of it
};

// Reads a JSONL file ("-": stdin) a chunk of records at a time (at most 1,024 lines or 4 MiB of
// them, plus one line of up to max_record_bytes(): memory stays bounded however long the file).
// Each chunk's records are parsed, rendered, encoded and labelled on the thread pool, `format` (when
// given) runs there on each record too, and `sink` gets the chunk in file order. Problems are
// InputErrors naming "path:line"; the first in file order is thrown after the records before it have
// gone to `sink`, as a record-by-record loop would. Empty tokenizations are not refused here, and
// the cache (LoadOptions::cache) is load_jsonl's: the stream neither reads nor writes it.
void stream_jsonl(const std::string& path, int64_t vocab, const LoadOptions& opt,
                  const std::function<void(LoadedRecord&)>& format,
                  const std::function<void(std::vector<LoadedRecord>&)>& sink);

// Reads a JSONL file. Every problem is an InputError naming "path:line". Token ids must be in
// [0, vocab); labels in [0, vocab) or -100. `tokenizer` is called (once) at the first text record.
// Lines longer than max_record_bytes() are refused before they are buffered whole.
Dataset load_jsonl(const std::string& path, int64_t vocab,
                   const std::function<const Tokenizer&()>& tokenizer = nullptr);
// The same with the options above: records are tokenized in parallel (encode_batch), with the
// cache.
Dataset load_jsonl(const std::string& path, int64_t vocab, const LoadOptions& opt);
// The cache file load_jsonl(path, ...) uses with these options ("" when there is none, e.g. stdin).
std::string dataset_cache_path(const std::string& path, int64_t vocab, const LoadOptions& opt);

// One micro-batch in host memory, ready for upload: B sequences padded to T.
struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> ids;      // [B*T]
  std::vector<int32_t> targets;  // [B*T], HF causal shift: targets[t] = labels[t+1]; -100 beyond
  // Packed rows only (data/pack.h): [B*T], each token's position inside its record; empty when
  // every row is one record (position = t).
  std::vector<int32_t> pos;
  int64_t trained = 0;  // number of targets != -100
  int64_t N() const { return int64_t(B) * T; }
};

// Builds a batch from records (each cut to seq_len; T = the longest cut record, padded with id 0
// and target -100). Sequences never attend across records.
Batch make_batch(const std::vector<const Record*>& recs, int seq_len);

// Trained targets of one record after the cut (for counting before a step).
int64_t trained_targets(const Record& r, int seq_len);

// The record order for training: the record used at global position i (i = 0, 1, ...),
// shuffled per epoch with a seed, or file order.
class RecordOrder {
 public:
  RecordOrder(size_t n, bool shuffle, uint64_t seed) : n_(n), shuffle_(shuffle), seed_(seed) {}
  size_t at(uint64_t i);

 private:
  size_t n_;
  bool shuffle_;
  uint64_t seed_;
  uint64_t epoch_ = UINT64_MAX;
  std::vector<size_t> perm_;
};

}  // namespace sf
