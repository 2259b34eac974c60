/* The C ABI from an installed kdtree: version, an offline runtime, an error message.
 * Usage: consumer_c CACHE_DIR */
#include <kdtree/kdtree.h>

#include <stdio.h>
#include <string.h>

#define EXPECT(cond)                                                                           \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "consumer_c: %s failed (last error: %s)\n", #cond, kdtree_last_error()); \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

int main(int argc, char** argv) {
  const char* cache_dir = argc > 1 ? argv[1] : NULL;
  EXPECT(strcmp(kdtree_version(), EXPECTED_VERSION) == 0);

  kdtree_runtime* rt = NULL;
  EXPECT(kdtree_runtime_create_offline(120, cache_dir, &rt) == KDTREE_OK);
  int sm = 0;
  EXPECT(kdtree_runtime_arch(rt, &sm) == KDTREE_OK);
  EXPECT(sm == 120);

  /* Bad input is a status and a message, never a crash. */
  EXPECT(kdtree_verify_attention(rt, NULL) == KDTREE_ERROR_INVALID_ARGUMENT);
  EXPECT(strlen(kdtree_last_error()) > 0);
  EXPECT(kdtree_runtime_destroy(rt) == KDTREE_OK);

  printf("consumer_c: kdtree %s, offline runtime for sm_%d\n", kdtree_version(), sm);
  return 0;
}
