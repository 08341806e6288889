// tools/options_doc.cc — prints the option table as Markdown, with --pytorch-keys the table of
// PyTorch 2.15's allocator keys and what bucketalloc does with each, with --environment the table of
// the environment variables bucketalloc reads (docs/configuration.md embeds the three; options_test
// keeps them equal). Usage: bucketalloc_options_doc [--pytorch-keys | --environment] > table.md
#include <cstring>
#include <iostream>

#include "bucketalloc/options.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--pytorch-keys") == 0) {
    std::cout << bucketalloc::PyTorchKeysMarkdownTable();
  } else if (argc > 1 && std::strcmp(argv[1], "--environment") == 0) {
    std::cout << bucketalloc::EnvVariablesMarkdownTable();
  } else if (argc > 1) {
    std::cerr << "usage: bucketalloc_options_doc [--pytorch-keys | --environment]\n";
    return 2;
  } else {
    std::cout << bucketalloc::OptionsMarkdownTable();
  }
  if (!std::cout.flush()) {  // a full disk or /dev/full: the table is not there
    std::cerr << "bucketalloc_options_doc: writing the standard output failed\n";
    return 1;
  }
  return 0;
}
