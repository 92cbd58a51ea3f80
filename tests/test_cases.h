/* Table-driven tests as named cases, so that CTest runs and reports each case on its own.
 * An executable builds its list of cases (the same on every device: listing opens none) and hands it to
 * test_cases_main, which takes
 *   --list       print one case name a line (unique, [A-Za-z0-9_.+/-] only) and exit
 *   --case NAME  run that case alone: exit 0 passed, 1 failed, TEST_SKIP_CODE skipped on this device
 *   neither      run every case in one process and print the summary, as before
 * Each case draws its random inputs from a stream seeded by the seed and its name, so a case that failed in
 * the whole run repeats alone with --case and the same FLASHCL_TEST_SEED. */
#ifndef FLASHCL_TEST_CASES_H
#define FLASHCL_TEST_CASES_H

#include "test_util.h"

/* CTest's SKIP_RETURN_CODE for the case tests (tests/CMakeLists.txt). */
#define TEST_SKIP_CODE 77
#define TEST_CASE_NAME_MAX 160

/* Reports through check() and skip(); a case that reports nothing fails. */
typedef void (*test_case_fn)(test_env *env, const void *arg);

typedef struct test_case {
  char name[TEST_CASE_NAME_MAX];
  test_case_fn run;
  const void *arg;
} test_case;

typedef struct test_cli {
  int list;
  const char *only; /* --case NAME */
  int small;        /* --small: the suite's short list of cases */
} test_cli;

/* 1 when argv[*i] is --small, --list, or --case followed by a name (then *i moves past the name); 0
   otherwise. */
int test_cli_option(test_cli *cli, int argc, char **argv, int *i);
/* For a suite with no options of its own: the whole command line through test_cli_option; 0, or 2 after
   printing the usage. */
int test_cli_parse(test_cli *cli, int argc, char **argv);

/* Appends a case named prefix + name and returns the new count; exits with status 2 when the list is full. */
int test_case_add(test_case *list, int count, int max, const char *prefix, const char *name, test_case_fn run,
                  const void *arg);

/* Lists, runs one case or runs them all, as cli says; returns the process's exit status. */
int test_cases_main(const char *suite, const test_cli *cli, const test_case *cases, int count);

#endif
