// tools/options_doc.cc — prints the option table as Markdown (docs/configuration.md embeds it;
// options_test keeps the two equal). Usage: bucketalloc_options_doc > table.md
#include <iostream>

#include "bucketalloc/options.h"

int main() {
  std::cout << bucketalloc::OptionsMarkdownTable();
  return 0;
}
