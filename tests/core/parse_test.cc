// Small value parsers: integer lists for flags, and the DSUF_* environment knobs' fixed choices
// (env_choice / env_picks, which every CUDA run reads for its kernel paths).
#include "core/parse.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace dsuf {
namespace {

TEST(ParseIntList, ValuesAndErrors) {
  EXPECT_EQ(parse_int_list("8192,131072", "--contexts", 1, 1 << 21), (std::vector<int64_t>{8192, 131072}));
  EXPECT_EQ(parse_int_list("-3", "--x", -5, 5), (std::vector<int64_t>{-3}));
  for (const char* bad : {"", "1,", ",1", "1,,2", "x", "1.5", "7", "99999999999999999999"}) {
    try {
      parse_int_list(bad, "--x", -5, 5);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--x"), std::string::npos) << e.what();
    }
  }
}

// setenv for the scope of a test, restored after.
struct EnvVar {
  std::string name;
  EnvVar(const char* n, const char* v) : name(n) {
    if (v) setenv(n, v, 1);
    else unsetenv(n);
  }
  ~EnvVar() { unsetenv(name.c_str()); }
};

TEST(EnvChoice, DefaultValuesAndErrors) {
  {
    EnvVar e("DSUF_TEST_KNOB", nullptr);
    EXPECT_EQ(env_choice("DSUF_TEST_KNOB", {"pipe", "regs", "deep"}), 0);
    EXPECT_FALSE(env_picks("DSUF_TEST_KNOB", "cp", "tiles"));
  }
  {
    EnvVar e("DSUF_TEST_KNOB", "deep");
    EXPECT_EQ(env_choice("DSUF_TEST_KNOB", {"pipe", "regs", "deep"}), 2);
  }
  {
    EnvVar e("DSUF_TEST_KNOB", "tiles");
    EXPECT_TRUE(env_picks("DSUF_TEST_KNOB", "cp", "tiles"));
    EXPECT_EQ(env_choice("DSUF_TEST_KNOB", {"cp", "tiles"}), 1);
  }
  {
    EnvVar e("DSUF_TEST_KNOB", "Deep");  // case matters: a typo must not silently pick the default
    try {
      env_choice("DSUF_TEST_KNOB", {"pipe", "regs", "deep"});
      ADD_FAILURE() << "accepted Deep";
    } catch (const Error& err) {
      const std::string m = err.what();
      EXPECT_NE(m.find("DSUF_TEST_KNOB=Deep"), std::string::npos) << m;
      EXPECT_NE(m.find("pipe, regs, deep"), std::string::npos) << m;
    }
    EXPECT_THROW(env_picks("DSUF_TEST_KNOB", "cp", "tiles"), Error);
  }
}

TEST(EnvFlags, SubsetsAndErrors) {
  {
    EnvVar e("DSUF_TEST_FLAGS", nullptr);
    EXPECT_EQ(env_flags("DSUF_TEST_FLAGS", {"mix", "pv", "route"}), 0u);
  }
  {
    EnvVar e("DSUF_TEST_FLAGS", "route");
    EXPECT_EQ(env_flags("DSUF_TEST_FLAGS", {"mix", "pv", "route"}), 4u);
  }
  {
    EnvVar e("DSUF_TEST_FLAGS", "route,mix");
    EXPECT_EQ(env_flags("DSUF_TEST_FLAGS", {"mix", "pv", "route"}), 5u);
  }
  for (const char* bad : {"mix,pvx", "mix,", ",mix", "Mix"}) {
    EnvVar e("DSUF_TEST_FLAGS", bad);
    try {
      env_flags("DSUF_TEST_FLAGS", {"mix", "pv", "route"});
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& err) {
      const std::string m = err.what();
      EXPECT_NE(m.find("DSUF_TEST_FLAGS="), std::string::npos) << m;
      EXPECT_NE(m.find("mix, pv, route"), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace dsuf
