#include "hpm/io/csv.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <limits>

#include "io/io_test_util.h"

namespace hpm::io {
namespace {

using testing::io_error_of;

class CsvTest : public testing::TempDirTest {
 protected:
  std::string file(const std::string& contents) {
    const std::string p = path("data.csv");
    write_raw(p, contents);
    return p;
  }
  std::vector<std::vector<std::string>> fields_of(const std::string& contents,
                                                  CsvOptions opt = {}) {
    CsvReader reader(file(contents), opt);
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> f;
    while (reader.next_fields(f)) rows.push_back(f);
    return rows;
  }
};

using Rows = std::vector<std::vector<std::string>>;

TEST_F(CsvTest, HeaderAndPlainRows) {
  CsvReader reader(file("a,b,c\n1,2,3\n4,5,6\n"));
  EXPECT_EQ(reader.column_names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(reader.column("c"), 2u);
  EXPECT_CONTAINS(io_error_of([&] { reader.column("d"); }), "no column 'd'");
  std::vector<CsvValue> row;
  ASSERT_TRUE(reader.next(row));
  EXPECT_EQ(reader.line(), 2u);
  EXPECT_EQ(std::get<std::string>(row[1]), "2");
  ASSERT_TRUE(reader.next(row));
  EXPECT_EQ(reader.line(), 3u);
  EXPECT_FALSE(reader.next(row));
}

TEST_F(CsvTest, QuotingPerRfc4180) {
  CsvOptions opt;
  opt.header = false;
  const Rows rows = fields_of(
      "\"a,b\",\"say \"\"hi\"\"\",plain\r\n"
      "\"multi\nline\",\"crlf\r\ninside\",\"\"\r\n"
      ",\"\",x\n"
      "last,no,newline",
      opt);
  const Rows expect = {{"a,b", "say \"hi\"", "plain"},
                       {"multi\nline", "crlf\r\ninside", ""},
                       {"", "", "x"},
                       {"last", "no", "newline"}};
  EXPECT_EQ(rows, expect);
}

TEST_F(CsvTest, LineNumbersCountNewlinesInsideQuotes) {
  CsvReader reader(file("h1,h2\n\"a\nb\nc\",1\n\nx,2\n"));
  std::vector<std::string> f;
  ASSERT_TRUE(reader.next_fields(f));
  EXPECT_EQ(reader.line(), 2u);
  ASSERT_TRUE(reader.next_fields(f));  // the empty line 5 is skipped
  EXPECT_EQ(reader.line(), 6u);
  EXPECT_EQ(f, (std::vector<std::string>{"x", "2"}));
}

TEST_F(CsvTest, OtherDelimiterAndBom) {
  CsvOptions opt;
  opt.delimiter = '\t';
  CsvReader reader(file("\xEF\xBB\xBFname\tvalue\n\"tab\there\"\t, fine\n"), opt);
  EXPECT_EQ(reader.column_names()[0], "name");
  std::vector<std::string> f;
  ASSERT_TRUE(reader.next_fields(f));
  EXPECT_EQ(f, (std::vector<std::string>{"tab\there", ", fine"}));
}

TEST_F(CsvTest, QuotingErrors) {
  CsvOptions opt;
  opt.header = false;
  EXPECT_CONTAINS(io_error_of([&] { fields_of("a,b\"c\n", opt); }),
                  "line 1, column 2: unexpected '\"' inside an unquoted field");
  const std::string after = io_error_of([&] { fields_of("ok,ok\n\"a\"b,c\n", opt); });
  EXPECT_CONTAINS(after, path("data.csv") + ": line 2, column 1");
  EXPECT_CONTAINS(after, "after the closing quote, found 'b'");
  EXPECT_CONTAINS(io_error_of([&] { fields_of("x\n\"open\nnever closed\n", opt); }),
                  "line 2, column 1: unterminated quoted field");
  EXPECT_CONTAINS(io_error_of([&] { fields_of("a,b\n1,2,3\n", opt); }),
                  "line 2: expected 2 fields, found 3");
}

TEST_F(CsvTest, TypedColumnsAndErrors) {
  CsvOptions opt;
  opt.types = {ColumnType::String, ColumnType::F32, ColumnType::I64};
  CsvReader reader(file("name,price,count\n"
                        "apple, 1.5 ,3\n"
                        "pear,-2e3,+4\n"
                        "\"quoted\",\"7\",\"-9223372036854775808\"\n"
                        "bad,abc,1\n"),
                   opt);
  std::vector<CsvValue> row;
  ASSERT_TRUE(reader.next(row));
  EXPECT_EQ(std::get<std::string>(row[0]), "apple");
  EXPECT_EQ(std::get<float>(row[1]), 1.5f);
  EXPECT_EQ(std::get<std::int64_t>(row[2]), 3);
  ASSERT_TRUE(reader.next(row));
  EXPECT_EQ(std::get<float>(row[1]), -2000.0f);
  EXPECT_EQ(std::get<std::int64_t>(row[2]), 4);
  ASSERT_TRUE(reader.next(row));
  EXPECT_EQ(std::get<float>(row[1]), 7.0f);
  EXPECT_EQ(std::get<std::int64_t>(row[2]), std::numeric_limits<std::int64_t>::min());
  const std::string msg = io_error_of([&] { reader.next(row); });
  EXPECT_EQ(msg, path("data.csv") + ": line 5, column 'price': expected a number, got 'abc'");

  auto one = [&](const std::string& text) {
    return io_error_of([&] {
      CsvReader r(file("name,price,count\n" + text), opt);
      std::vector<CsvValue> v;
      while (r.next(v)) {
      }
    });
  };
  EXPECT_CONTAINS(one("x,1,2.5\n"), "line 2, column 'count': expected an integer, got '2.5'");
  EXPECT_CONTAINS(one("x,1,99999999999999999999\n"), "out of range for int64");
  EXPECT_CONTAINS(one("x,1e99,1\n"), "out of range for float32");
  EXPECT_CONTAINS(one("x,1.5x,1\n"), "expected a number, got '1.5x'");

  CsvOptions wrong = opt;
  wrong.types.push_back(ColumnType::F32);
  EXPECT_CONTAINS(io_error_of([&] { CsvReader r(file("a,b,c\n"), wrong); }),
                  "line 1: the header has 3 columns, expected 4");
}

TEST_F(CsvTest, MissingValuesUseDefaultsOrFail) {
  CsvOptions opt;
  opt.types = {ColumnType::String, ColumnType::F32, ColumnType::I64};
  opt.defaults = {std::string("anon"), std::string("0.25"), std::nullopt};
  CsvReader reader(file("name,price,count\n"
                        ",,1\n"
                        "\"\", ,2\n"
                        "a,1,\n"),
                   opt);
  std::vector<CsvValue> row;
  ASSERT_TRUE(reader.next(row));
  EXPECT_EQ(std::get<std::string>(row[0]), "anon");
  EXPECT_EQ(std::get<float>(row[1]), 0.25f);
  ASSERT_TRUE(reader.next(row));
  EXPECT_EQ(std::get<std::string>(row[0]), "");  // quoted empty string is a value
  EXPECT_EQ(std::get<float>(row[1]), 0.25f);     // blank number is missing
  EXPECT_EQ(
      io_error_of([&] { reader.next(row); }),
      path("data.csv") + ": line 4, column 'count': missing value and the column has no default");

  CsvOptions bad = opt;
  bad.defaults[1] = std::string("cheap");
  CsvReader r2(file("name,price,count\nx,,1\n"), bad);
  EXPECT_CONTAINS(io_error_of([&] { r2.next(row); }),
                  "line 2, column 'price': missing value, and the column's default is invalid: "
                  "expected a number, got 'cheap'");

  CsvOptions count = opt;
  count.defaults.pop_back();
  EXPECT_CONTAINS(io_error_of([&] { CsvReader r(file("a,b,c\n"), count); }),
                  "2 defaults given for 3 column types");
}

TEST_F(CsvTest, NoHeaderUsesColumnNumbersAndLargeFiles) {
  CsvOptions opt;
  opt.header = false;
  opt.types = {ColumnType::I64, ColumnType::F32};
  std::string text;
  for (int i = 0; i < 50000; ++i) text += std::to_string(i) + "," + std::to_string(i) + ".5\r\n";
  text += "50000,oops\n";
  CsvReader reader(file(text), opt);
  std::vector<CsvValue> row;
  for (int i = 0; i < 50000; ++i) {
    ASSERT_TRUE(reader.next(row));
    ASSERT_EQ(std::get<std::int64_t>(row[0]), i);
    ASSERT_EQ(std::get<float>(row[1]), static_cast<float>(i) + 0.5f);
  }
  EXPECT_CONTAINS(io_error_of([&] { reader.next(row); }),
                  "line 50001, column 2: expected a number, got 'oops'");
}

TEST_F(CsvTest, TextLines) {
  const std::string p = path("lines.txt");
  write_raw(p, "first\r\nsecond\n\nfourth\r\n\rfifth\nlast");
  TextLineReader reader(p);
  std::vector<std::string> lines;
  std::string line;
  while (reader.next(line)) lines.push_back(line);
  EXPECT_EQ(lines, (std::vector<std::string>{"first", "second", "", "fourth", "\rfifth", "last"}));
  EXPECT_EQ(reader.line(), 6u);

  write_raw(p, "");
  TextLineReader empty(p);
  EXPECT_FALSE(empty.next(line));
  write_raw(p, "only\n");
  TextLineReader one(p);
  ASSERT_TRUE(one.next(line));
  EXPECT_EQ(line, "only");
  EXPECT_FALSE(one.next(line));

  // Lines longer than the stream buffer.
  const std::string longline(1 << 20, 'x');
  write_raw(p, longline + "\r\n" + "y");
  TextLineReader big(p);
  ASSERT_TRUE(big.next(line));
  EXPECT_EQ(line, longline);
  ASSERT_TRUE(big.next(line));
  EXPECT_EQ(line, "y");
  EXPECT_CONTAINS(io_error_of([&] { TextLineReader r(path("nope.txt")); }), path("nope.txt"));
}

TEST_F(CsvTest, CompressedCsvAndTextLines) {
  const std::string p = path("data.csv.gz");
  const std::string text = "a,b\r\n1,\"x\"\r\n2,y\r\n";
  gzFile gz = gzopen(p.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(gz), Z_OK);

  CsvOptions opt;
  opt.types = {ColumnType::I64, ColumnType::String};
  opt.compression = Compression::Gzip;
  CsvReader reader(p, opt);
  std::vector<CsvValue> row;
  ASSERT_TRUE(reader.next(row));
  EXPECT_EQ(std::get<std::int64_t>(row[0]), 1);
  EXPECT_EQ(std::get<std::string>(row[1]), "x");
  ASSERT_TRUE(reader.next(row));
  EXPECT_EQ(std::get<std::string>(row[1]), "y");
  EXPECT_FALSE(reader.next(row));

  TextLineReader lines(p, Compression::Gzip);
  std::string line;
  std::vector<std::string> all;
  while (lines.next(line)) all.push_back(line);
  EXPECT_EQ(all, (std::vector<std::string>{"a,b", "1,\"x\"", "2,y"}));
}

}  // namespace
}  // namespace hpm::io
