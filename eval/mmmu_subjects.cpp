// MMMU's subject table (see mmmu_subjects.h).
#include "eval/mmmu_subjects.h"

#include "eval/pystr.h"

namespace gmod::eval::mmmu {

const std::vector<std::pair<std::string, std::vector<std::string>>>& disciplines() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> d = {
      {"Art and Design", {"Art", "Art_Theory", "Design", "Music"}},
      {"Business", {"Accounting", "Economics", "Finance", "Manage", "Marketing"}},
      {"Science", {"Biology", "Chemistry", "Geography", "Math", "Physics"}},
      {"Health and Medicine",
       {"Basic_Medical_Science", "Clinical_Medicine", "Diagnostics_and_Laboratory_Medicine", "Pharmacy",
        "Public_Health"}},
      {"Humanities and Social Science", {"History", "Literature", "Sociology", "Psychology"}},
      {"Tech and Engineering",
       {"Agriculture", "Architecture_and_Engineering", "Computer_Science", "Electronics", "Energy_and_Power",
        "Materials", "Mechanical_Engineering"}},
  };
  return d;
}

const std::vector<std::string>& subjects() {
  static const std::vector<std::string> s = {"Accounting",
                                             "Agriculture",
                                             "Architecture_and_Engineering",
                                             "Art",
                                             "Art_Theory",
                                             "Basic_Medical_Science",
                                             "Biology",
                                             "Chemistry",
                                             "Clinical_Medicine",
                                             "Computer_Science",
                                             "Design",
                                             "Diagnostics_and_Laboratory_Medicine",
                                             "Economics",
                                             "Electronics",
                                             "Energy_and_Power",
                                             "Finance",
                                             "Geography",
                                             "History",
                                             "Literature",
                                             "Manage",
                                             "Marketing",
                                             "Materials",
                                             "Math",
                                             "Mechanical_Engineering",
                                             "Music",
                                             "Pharmacy",
                                             "Physics",
                                             "Psychology",
                                             "Public_Health",
                                             "Sociology"};
  return s;
}

std::string subject_of(const std::string& id) {
  const std::vector<std::string> words = py::split(id, "_");
  std::string cat;
  for (size_t i = 1; i + 1 < words.size(); ++i) cat += (i > 1 ? "_" : "") + words[i];
  return cat;
}

}  // namespace gmod::eval::mmmu
