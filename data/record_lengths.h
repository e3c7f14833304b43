// LLaVA's modality lengths (group_by_modality_length) of a record file, computed straight from the record bytes:
// the cold start's cost at LLaVA-665k scale (issue 47). Each worker reads its contiguous share of the file in large
// blocks and parses each record with simdjson's validating DOM parser (Debian's libsimdjson-dev); a record the fast
// path cannot decide with certainty — malformed, ill-typed, a repeated key, a key other than LLaVA's "id", "image",
// "conversations" (in turns: "from", "value"), a surrogate escape, an integer id beyond 64 bits — is parsed again
// with parse_record (data/records.h), so the result equals parsing every record with parse_record, whatever the
// record holds and whatever other layouts parse_record learns.
//
// A record's length: the number of words (runs of characters other than ' ', '\n', '\t', '\r') over the values of
// its turns, + 128 when it names an image; negative (at least 1 word) for a text-only record; -1 for a record
// parse_record rejects.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gmod {

class RecordFile;

// The length of one record from parse_record's result (-1 when it throws RecordError): the reference.
int64_t modality_length_parsed(const std::string& json_text, const std::string& where);

// The fast path alone: true with `out` set when the record is plainly valid, false when it must be parsed with
// parse_record (then `out` is untouched).
bool modality_length_fast(const std::string& json_text, int64_t& out);

// The lengths of records [begin, end) of `records` on `threads` threads. `fallbacks`, when given, receives the number
// of records that were parsed with parse_record.
std::vector<int64_t> compute_record_lengths(const RecordFile& records, size_t begin, size_t end, unsigned threads,
                                            size_t* fallbacks = nullptr);

}  // namespace gmod
