// Hostile AdmissionReview bodies: deep, huge, wrong types, not JSON. Each
// gets a clear refusal (HTTP 400 naming what is wrong, or a review that
// refuses with 400), never a crash or an exception; and a well-formed
// review is answered with its uid.
#include <gtest/gtest.h>

#include "moeserve/operator/quota_admission.hpp"

namespace moeserve::op {
namespace {

json Review(json request) {
  return {{"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}, {"request", request}};
}

json CreateRequest(json object) {
  return {{"uid", "u-1"},
          {"kind", {{"group", "moeserve.io"}, {"version", "v1alpha1"}, {"kind", "MoEDeployment"}}},
          {"resource", {{"group", "moeserve.io"}, {"version", "v1alpha1"}, {"resource", "moedeployments"}}},
          {"operation", "CREATE"},
          {"namespace", "team-a"},
          {"name", "md"},
          {"object", object}};
}

json Md(int replicas) {
  return {{"apiVersion", "moeserve.io/v1alpha1"},
          {"kind", "MoEDeployment"},
          {"metadata", {{"name", "md"}, {"namespace", "team-a"}}},
          {"spec",
           {{"image", "i"},
            {"model", {{"uri", "s3://m/"}}},
            {"parallelism", {{"nodesPerReplica", 1}, {"gpusPerNode", 8}}},
            {"replicas", replicas},
            {"quotaPolicyRef", {{"name", "team-a"}}}}}};
}

class AdmissionReviewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    policies_.Upsert({{"metadata", {{"name", "team-a"}, {"namespace", "team-a"}}},
                      {"spec", {{"limits", {{"maxGPUs", 16}}}}}});
  }
  AdmissionHttpAnswer Send(const std::string& body) { return admission_.Review(body); }
  ObjectCache policies_, deployments_;
  QuotaAdmission admission_{policies_, deployments_};
};

TEST_F(AdmissionReviewTest, AWellFormedReviewIsAnsweredWithItsUid) {
  auto ok = Send(Review(CreateRequest(Md(2))).dump());
  ASSERT_EQ(ok.http_status, 200);
  json answer = json::parse(ok.body);
  EXPECT_EQ(answer["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(answer["response"]["uid"], "u-1");
  EXPECT_EQ(answer["response"]["allowed"], true);

  auto refused = json::parse(Send(Review(CreateRequest(Md(3))).dump()).body);
  EXPECT_EQ(refused["response"]["allowed"], false);
  EXPECT_EQ(refused["response"]["status"]["code"], 403);
  EXPECT_EQ(refused["response"]["status"]["message"],
            "QuotaPolicy team-a: limits.maxGPUs is 16; this MoEDeployment would bring the namespace to 24");
}

TEST_F(AdmissionReviewTest, BodiesThatAreNotAReviewAre400WithTheReason) {
  struct Case {
    std::string body, expect;
  };
  const std::vector<Case> cases = {
      {"", "not valid JSON"},
      {"{\"apiVersion\":", "not valid JSON"},
      {"[1,2,3]", "not a JSON object"},
      {std::string(100000, '[') + std::string(100000, ']'), "more than 64 levels deep"},
      {json({{"apiVersion", "admission.k8s.io/v1beta1"}, {"kind", "AdmissionReview"}, {"request", json::object()}}).dump(),
       "apiVersion must be admission.k8s.io/v1"},
      {Review("a string").dump(), "request: missing or not an object"},
      {Review({{"uid", 7}}).dump(), "request.uid: not a string"},
      {Review({{"operation", "CREATE"}}).dump(), "request.uid: missing"},
      {Review({{"uid", "u"}, {"operation", "CREATE"}, {"resource", "moedeployments"}, {"kind", json::object()}}).dump(),
       "request.resource: not an object"},
      {Review([] { json r = CreateRequest(json::object()); r["object"] = json::array({1}); return r; }()).dump(),
       "request.object: not an object"},
      {Review([] { json r = CreateRequest(json::object()); r["object"] = {{"metadata", 5}}; return r; }()).dump(),
       "request.object.metadata: not an object"},
      {Review([] { json r = CreateRequest(Md(1)); r["dryRun"] = "yes"; return r; }()).dump(),
       "request.dryRun: not a boolean"},
  };
  for (const auto& c : cases) {
    auto answer = Send(c.body);
    EXPECT_EQ(answer.http_status, 400) << c.expect;
    json status = json::parse(answer.body, nullptr, false);
    ASSERT_TRUE(status.is_object()) << answer.body;
    EXPECT_EQ(status["code"], 400);
    EXPECT_NE(status.value("message", "").find(c.expect), std::string::npos) << status.dump();
  }
}

// Found by fuzz_admission_review: the 400's message quotes the parser's view
// of the body, bytes that need not be UTF-8, and dump() threw on them
// (nlohmann type_error 316) instead of answering.
TEST_F(AdmissionReviewTest, BytesThatAreNotUtf8AreAnsweredNotThrown) {
  std::string body = Review(CreateRequest(Md(1))).dump();
  body.insert(body.find("\"name\":\"md\""), "\"x\": \xff\xfe");  // not JSON here: the parser quotes it
  auto unreadable = Send(body);
  EXPECT_EQ(unreadable.http_status, 400);
  EXPECT_TRUE(json::parse(unreadable.body, nullptr, false).is_object()) << unreadable.body;

  // (Inside a JSON string such bytes never get this far: the parser refuses them.)
}

TEST_F(AdmissionReviewTest, AHugeBodyIsRefusedBeforeItIsParsed) {
  std::string huge = Review(CreateRequest(Md(1))).dump();
  huge.insert(huge.size() - 2, ",\"pad\":\"" + std::string(kMaxAdmissionReviewBytes, 'x') + "\"");
  auto answer = Send(huge);
  EXPECT_EQ(answer.http_status, 400);
  EXPECT_NE(answer.body.find("more than the limit"), std::string::npos) << answer.body.substr(0, 300);
}

TEST_F(AdmissionReviewTest, ASpecOfTheWrongTypesIsRefusedWith400NotAdmitted) {
  for (json spec : {json("a string"), json({{"image", 5}, {"model", {{"uri", "s3://m/"}}}}),
                    json({{"image", "i"}, {"model", {{"uri", "s3://m/"}}}, {"replicas", "many"}}),
                    json({{"image", "i"}, {"model", {{"uri", "s3://m/"}}}, {"parallelism", {1, 2}}})}) {
    json md = Md(1);
    md["spec"] = spec;
    auto answer = Send(Review(CreateRequest(md)).dump());
    ASSERT_EQ(answer.http_status, 200);
    json review = json::parse(answer.body);
    EXPECT_EQ(review["response"]["allowed"], false) << spec.dump();
    EXPECT_EQ(review["response"]["status"]["code"], 400) << spec.dump();
  }
}

// A deployment created in the same second as a stored one (creationTimestamp
// has whole seconds) is still judged as the newer: everything stored counts.
TEST_F(AdmissionReviewTest, ACreateCountsEveryStoredDeploymentEvenInTheSameSecond) {
  json stored = Md(2);
  stored["metadata"]["name"] = "small";
  stored["metadata"]["creationTimestamp"] = "2026-12-01T00:00:00Z";
  deployments_.Upsert(stored);
  json big = Md(1);
  big["metadata"]["name"] = "big";  // sorts before "small"
  big["metadata"]["creationTimestamp"] = "2026-12-01T00:00:00Z";
  json request = CreateRequest(big);
  request["name"] = "big";
  json answer = json::parse(Send(Review(request).dump()).body);
  EXPECT_EQ(answer["response"]["allowed"], false);
  EXPECT_EQ(answer["response"]["status"]["message"],
            "QuotaPolicy team-a: limits.maxGPUs is 16; this MoEDeployment would bring the namespace to 24");
}

TEST_F(AdmissionReviewTest, ScaleReviewsAreJudgedOnTheStoredDeployment) {
  json stored = Md(1);
  stored["metadata"]["creationTimestamp"] = "2026-12-01T00:00:00Z";
  deployments_.Upsert(stored);
  auto scale = [&](json replicas) {
    json r = CreateRequest({{"apiVersion", "autoscaling/v1"}, {"kind", "Scale"}, {"spec", {{"replicas", replicas}}}});
    r["operation"] = "UPDATE";
    r["subResource"] = "scale";
    r["kind"] = {{"group", "autoscaling"}, {"version", "v1"}, {"kind", "Scale"}};
    r["oldObject"] = {{"apiVersion", "autoscaling/v1"}, {"kind", "Scale"}, {"spec", {{"replicas", 1}}}};
    return json::parse(Send(Review(r).dump()).body);
  };
  EXPECT_EQ(scale(2)["response"]["allowed"], true);
  json refused = scale(3);
  EXPECT_EQ(refused["response"]["allowed"], false);
  EXPECT_EQ(refused["response"]["status"]["message"],
            "QuotaPolicy team-a: limits.maxGPUs is 16; this MoEDeployment would bring the namespace to 24");
  json wrong = scale("three");
  EXPECT_EQ(wrong["response"]["allowed"], false);
  EXPECT_EQ(wrong["response"]["status"]["code"], 400);
}

}  // namespace
}  // namespace moeserve::op
