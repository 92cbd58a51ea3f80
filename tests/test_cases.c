#include "test_cases.h"

#include <stdlib.h>
#include <string.h>

int test_cli_option(test_cli *cli, int argc, char **argv, int *i) {
  if (!strcmp(argv[*i], "--small")) {
    cli->small = 1;
    return 1;
  }
  if (!strcmp(argv[*i], "--list")) {
    cli->list = 1;
    return 1;
  }
  if (!strcmp(argv[*i], "--case") && *i + 1 < argc) {
    cli->only = argv[++*i];
    return 1;
  }
  return 0;
}

int test_cli_parse(test_cli *cli, int argc, char **argv) {
  for (int i = 1; i < argc; ++i)
    if (!test_cli_option(cli, argc, argv, &i)) {
      fprintf(stderr, "usage: %s [--small] [--list | --case NAME]\n", argv[0]);
      return 2;
    }
  return 0;
}

int test_case_add(test_case *list, int count, int max, const char *prefix, const char *name, test_case_fn run,
                  const void *arg) {
  if (count >= max) {
    /* A case left out of the list would never run: stop, so the listing (and the build) fails. */
    fprintf(stderr, "case list full (%d entries): %s%s does not fit\n", max, prefix, name);
    exit(2);
  }
  test_case *c = &list[count];
  snprintf(c->name, sizeof c->name, "%s%s", prefix, name);
  c->run = run;
  c->arg = arg;
  return count + 1;
}

/* CTest test names, regular expressions and shells take these as they are. */
static int name_ok(const char *name) {
  if (!*name || strlen(name) + 1 >= TEST_CASE_NAME_MAX) return 0;
  for (const char *c = name; *c; ++c)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || strchr("_.+/-", *c)))
      return 0;
  return 1;
}

static int list_cases(const test_case *cases, int count) {
  int bad = 0;
  for (int i = 0; i < count; ++i) {
    if (!name_ok(cases[i].name)) {
      fprintf(stderr, "case name \"%s\": empty, too long, or a character outside [A-Za-z0-9_.+/-]\n", cases[i].name);
      bad = 1;
    }
    for (int j = 0; j < i; ++j)
      if (!strcmp(cases[i].name, cases[j].name)) {
        fprintf(stderr, "case name \"%s\" appears twice (entries %d and %d)\n", cases[i].name, j, i);
        bad = 1;
      }
  }
  if (bad) return 1;
  for (int i = 0; i < count; ++i) printf("%s\n", cases[i].name);
  return 0;
}

/* Runs one case from the start of its own random stream; a case that reports nothing fails. */
static void run_case(test_env *env, const test_case *c) {
  const int before = test_passed + test_failed + test_skipped;
  test_reseed(c->name);
  c->run(env, c->arg);
  if (test_passed + test_failed + test_skipped == before) check(0, "%s: the case reported nothing", c->name);
}

int test_cases_main(const char *suite, const test_cli *cli, const test_case *cases, int count) {
  if (cli->list) return list_cases(cases, count);
  const test_case *one = NULL;
  if (cli->only) {
    for (int i = 0; i < count && !one; ++i)
      if (!strcmp(cases[i].name, cli->only)) one = &cases[i];
    if (!one) {
      fprintf(stderr, "%s: no case named \"%s\" (--list names them)\n", suite, cli->only);
      return 1;
    }
  }
  test_seed();
  test_env env;
  if (test_open(&env, NULL)) return 1;
  if (one) run_case(&env, one);
  else
    for (int i = 0; i < count; ++i) run_case(&env, &cases[i]);
  test_close(&env);
  const int rc = test_summary(suite);
  /* Nothing passed and something was skipped (unsupported on this device): CTest's "skipped", not "passed". */
  return rc == 0 && test_passed == 0 && test_skipped > 0 ? TEST_SKIP_CODE : rc;
}
