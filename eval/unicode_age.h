// The one place gmod's Python string semantics (pystr.h, regex.h) cannot follow the originals exactly: the
// Unicode version. γ-MoD's scripts ran on Python 3.10 (its repository's __pycache__ is cpython-310), whose
// character database is Unicode 13.0; ICU and PCRE2 here know later versions. A character assigned after 13.0
// that is a letter, a digit, a space or has a lower-case form is unassigned for that Python (no class, no
// case): lower(), split(), isalpha(), float() and \d, \w, \s can treat it differently. Such characters are
// counted per file and reported as a named problem with the first examples, so the figure is never silently
// different.
#pragma once

#include <string>
#include <vector>

#include "eval/records.h"

namespace gmod::eval {

// Scans `path` (a file, or the .json/.jsonl/.txt/.tsv files under a folder) and adds one problem per file
// holding such characters: their count and the first three (code point, line).
void report_newer_unicode(const std::string& path, std::vector<Problem>* problems);

}  // namespace gmod::eval
