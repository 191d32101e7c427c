#include "controller/leader/catalog_mirror.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

loom::v1::Job MakeJob(const std::string& id, loom::v1::JobState state, int64_t created) {
  loom::v1::Job job;
  job.set_id(id);
  job.set_state(state);
  job.set_created_unix_ms(created);
  auto* t = job.add_history();
  t->set_to(loom::v1::PENDING);
  t->set_time_unix_ms(created);
  return job;
}

std::vector<std::string> Ids(const std::vector<loom::v1::Job>& jobs) {
  std::vector<std::string> ids;
  for (const auto& j : jobs) ids.push_back(j.id());
  return ids;
}

// The mirror reads everything once, then only what changed, and hands over
// the same jobs in the same order as a full load.
TEST(CatalogMirrorTest, ReadsOnlyChangesAndMatchesAFullLoad) {
  char tmpl[] = "/tmp/loom_mirror_test_XXXXXX";
  auto store = Store::Open(mkdtemp(tmpl));
  ASSERT_TRUE(store.ok()) << store.status();
  Store& st = **store;
  ASSERT_TRUE(st.PutJob(MakeJob("b-2", loom::v1::RUNNING, 2000), 1).ok());
  ASSERT_TRUE(st.PutJob(MakeJob("a-1", loom::v1::PENDING, 1000), 1).ok());
  CatalogMirror mirror(&st);
  EXPECT_EQ(*mirror.Refresh(), 2u);
  EXPECT_EQ(*mirror.Refresh(), 0u);  // nothing changed since
  loom::v1::Job b = MakeJob("b-2", loom::v1::SUCCEEDED, 2000);
  b.mutable_summary()->set_last_step(7);
  ASSERT_TRUE(st.PutJob(b, 0).ok());
  ASSERT_TRUE(st.PutJob(MakeJob("c-3", loom::v1::PENDING, 1000), 1).ok());
  EXPECT_EQ(*mirror.Refresh(), 2u);  // b again, and c
  EXPECT_EQ(mirror.size(), 3u);
  auto full = st.LoadJobs();
  ASSERT_TRUE(full.ok());
  std::vector<loom::v1::Job> warm = mirror.TakeAll();
  EXPECT_EQ(Ids(warm), Ids(*full));
  EXPECT_THAT(Ids(warm), ::testing::ElementsAre("a-1", "c-3", "b-2"));
  EXPECT_EQ(warm[2].state(), loom::v1::SUCCEEDED);
  EXPECT_EQ(warm[2].summary().last_step(), 7);
  EXPECT_EQ(mirror.size(), 0u);
}

}  // namespace
}  // namespace loom::controller
