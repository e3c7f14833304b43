// MMMU's subjects and disciplines (the benchmark's 30 subjects in 6 disciplines, as MMMU's
// mmmu/utils/data_utils.py lists them): the eval-only scorer walks the subjects in that order, skips ids of
// any other subject, and reports an instance-level accuracy per discipline.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace gmod::eval::mmmu {

// The subjects in the order eval_mmmu_only.py evaluates them (CAT_SHORT2LONG's values).
const std::vector<std::string>& subjects();
// (discipline, its subjects in the listed order), in DOMAIN_CAT2SUB_CAT's order.
const std::vector<std::pair<std::string, std::vector<std::string>>>& disciplines();
// The subject of an id: its '_'-separated words but the first and the last ("validation_Art_Theory_3").
std::string subject_of(const std::string& id);

}  // namespace gmod::eval::mmmu
