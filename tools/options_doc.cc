// tools/options_doc.cc — prints the option table as Markdown, or with --pytorch-keys the table of
// PyTorch 2.15's allocator keys and what bucketalloc does with each (docs/configuration.md embeds
// both; options_test keeps them equal). Usage: bucketalloc_options_doc [--pytorch-keys] > table.md
#include <cstring>
#include <iostream>

#include "bucketalloc/options.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--pytorch-keys") == 0) {
    std::cout << bucketalloc::PyTorchKeysMarkdownTable();
  } else if (argc > 1) {
    std::cerr << "usage: bucketalloc_options_doc [--pytorch-keys]\n";
    return 2;
  } else {
    std::cout << bucketalloc::OptionsMarkdownTable();
  }
  return 0;
}
