// POSIX path helpers for the checkpoint readers and writers (model/safetensors.cpp, model/checkpoint_files.cpp).
// std::filesystem is avoided on purpose: libtorch.so (PyPI wheel) exports its own copies of the std::filesystem
// operations (status, remove_all, create_directories, ...) built against a newer libstdc++; they interpose the system
// ones and some crash (remove_all calls a null function).
#pragma once

#include <sys/stat.h>

#include <string>

namespace gmod::posix_path {

inline bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
inline bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
inline bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}
inline std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}
inline std::string parent_dir(const std::string& p) {
  auto k = p.find_last_of('/');
  if (k == std::string::npos) return ".";
  return k == 0 ? "/" : p.substr(0, k);
}

}  // namespace gmod::posix_path
