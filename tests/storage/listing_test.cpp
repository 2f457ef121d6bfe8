// S3 ListObjectsV2 pages and error bodies read without an XML library
// (s3_listing.hpp): entries, entities, folders, continuation, and the
// refusals (cut-off entry, key outside the prefix, sizes that are not uint64).
#include <gtest/gtest.h>

#include "moeserve/storage/s3_listing.hpp"

namespace moeserve::storage {
namespace {

std::string Page(const std::string& contents, const std::string& tail = "<IsTruncated>false</IsTruncated>") {
  return "<?xml version=\"1.0\"?><ListBucketResult><Name>b</Name>" + tail + contents + "</ListBucketResult>";
}

std::string Entry(const std::string& key, const std::string& size) {
  return "<Contents><Key>" + key + "</Key><LastModified>x</LastModified><Size>" + size + "</Size></Contents>";
}

TEST(S3Listing, EntriesUnderThePrefixAreNamedRelativeToIt) {
  auto page = ParseS3ListPage(Page(Entry("m/a.bin", "5") + Entry("m/sub/", "0") + Entry("m/", "0") +
                                   Entry("m/x&amp;y&lt;1&gt;&#39;.bin", "18446744073709551615")),
                              "b", "m/");
  ASSERT_TRUE(page) << page.error().ToString();
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "a.bin");
  EXPECT_EQ(page->objects[0].size, 5u);
  EXPECT_EQ(page->objects[1].key, "x&y<1>'.bin");
  EXPECT_EQ(page->objects[1].size, UINT64_MAX);
  EXPECT_TRUE(page->next_continuation_token.empty());
}

TEST(S3Listing, ATruncatedPageCarriesItsTokenUnescaped) {
  auto page = ParseS3ListPage(
      Page(Entry("a", "1"), "<IsTruncated>true</IsTruncated><NextContinuationToken>t&amp;lt;</NextContinuationToken>"),
      "b", "");
  ASSERT_TRUE(page) << page.error().ToString();
  EXPECT_EQ(page->next_continuation_token, "t&lt;");  // &amp; decoded once, last
}

TEST(S3Listing, RefusalsNameTheBucketAndKey) {
  auto cut = ParseS3ListPage("<ListBucketResult><Contents><Key>m/a</Key><Size>1", "b", "m/");
  ASSERT_FALSE(cut);
  EXPECT_EQ(cut.error().code(), ErrorCode::kUnavailable);
  EXPECT_NE(cut.error().message().find("mid-entry"), std::string::npos);

  auto outside = ParseS3ListPage(Page(Entry("n/a", "1")), "b", "m/");
  ASSERT_FALSE(outside);
  EXPECT_EQ(outside.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(outside.error().message().find("'n/a'"), std::string::npos);

  for (const char* size : {"", "-1", "+1", "1x", " 1", "18446744073709551616", "0x10"}) {
    auto bad = ParseS3ListPage(Page(Entry("m/a", size)), "b", "m/");
    ASSERT_FALSE(bad) << "size '" << size << "' accepted";
    EXPECT_NE(bad.error().message().find("no valid <Size>"), std::string::npos) << bad.error().message();
  }
}

TEST(S3Listing, ErrorBodyFields) {
  const std::string body = "<Error><Code>NoSuchKey</Code><Message>a &quot;b&quot;</Message></Error>";
  EXPECT_EQ(XmlField(body, "Code"), "NoSuchKey");
  EXPECT_EQ(XmlUnescape(XmlField(body, "Message")), "a \"b\"");
  EXPECT_EQ(XmlField(body, "Missing"), "");
  EXPECT_EQ(XmlField("<Code>unclosed", "Code"), "");
}

}  // namespace
}  // namespace moeserve::storage
