// Capture of libbpf's print output (libbpf_set_print is process-global).
#pragma once
#include <string>

namespace meshcap {

// While alive, libbpf messages printed on *this thread* (info and warnings,
// which include the verifier log of a failed load) go into text(). Being
// thread-scoped, two loads on two worker threads never mix their logs.
class LibbpfLogCapture {
 public:
  LibbpfLogCapture();
  ~LibbpfLogCapture();
  LibbpfLogCapture(const LibbpfLogCapture&) = delete;
  LibbpfLogCapture& operator=(const LibbpfLogCapture&) = delete;
  const std::string& text() const { return text_; }
  void Append(const char* s, size_t n);

 private:
  LibbpfLogCapture* prev_;
  std::string text_;
};

}  // namespace meshcap
