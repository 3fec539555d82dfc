// Who may talk to the collector, over real sockets: CurveZMQ keys admitted
// by the allow-list, a key bound to its node name, plaintext refused unless
// both sides say --insecure, and a flooding peer throttled beside a normal
// one. The agents here are raw ZeroMQ DEALER sockets speaking the real
// protocol (and, where the agent's own words matter, the real agent).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <optional>
#include <zmq.hpp>

#include "common/clock.h"
#include "proto/agent.capnp.h"
#include "proto/codec.h"
#include "tests/support/cluster.h"
#include "tests/support/harness.h"
#include "tests/support/hello.h"
#include "tests/support/keys.h"
#include "tools/cli/client.h"

namespace rankscope::testing {
namespace {

namespace wire = proto::wire;

std::string endpoint(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }

// A collector on fresh ports, with keys (or --insecure).
class Collector {
 public:
  Collector(const TempDir& dir, TestKeys* keys, std::vector<std::string> extra = {})
      : agent_port(free_port()), query_port(free_port()) {
    SpawnOptions spawn;
    spawn.argv = {bin_path("rankscope-collector"), "--listen", endpoint(agent_port), "--query", endpoint(query_port),
                  "--db", dir.file("db-" + std::to_string(agent_port))};
    auto security = keys ? keys->collector_args() : std::vector<std::string>{"--insecure"};
    spawn.argv.insert(spawn.argv.end(), security.begin(), security.end());
    spawn.argv.insert(spawn.argv.end(), extra.begin(), extra.end());
    log = dir.file("collector-" + std::to_string(agent_port) + ".log");
    spawn.stdout_path = log;
    process = std::make_unique<Process>(spawn);
    cli::QueryClient client(endpoint(query_port), 500, keys ? keys->client() : curve::ClientKeys{});
    up = wait_for([&] { return status(client).has_value(); }, std::chrono::seconds(20));
  }
  // The status reply's (total bad, total throttled, per node: bad/throttled), or nothing.
  struct Status {
    uint64_t bad = 0, throttled = 0;
    std::map<std::string, std::pair<uint64_t, uint64_t>> nodes;  // bad, throttled
  };
  static std::optional<Status> status(cli::QueryClient& client) {
    capnp::MallocMessageBuilder request;
    auto req = request.initRoot<proto::query::Request>();
    req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
    req.setStatus();
    Status s;
    auto r = client.ask(request, [&](proto::query::Reply::Reader reply) {
      auto st = reply.getStatus();
      s.bad = st.getBadMessages();
      s.throttled = st.getThrottledMessages();
      for (auto n : st.getNodes()) s.nodes[n.getNode()] = {n.getBadMessages(), n.getThrottledMessages()};
    });
    if (!r) return std::nullopt;
    return s;
  }
  int agent_port, query_port;
  std::string log;
  std::unique_ptr<Process> process;
  bool up = false;
};

// One agent connection, speaking the wire protocol by hand.
class RawAgent {
 public:
  RawAgent(int port, const curve::ClientKeys& keys) : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    curve::apply(socket_, keys);
    socket_.connect(endpoint(port));
  }
  void send(const std::string& bytes) { socket_.send(zmq::buffer(bytes), zmq::send_flags::dontwait); }
  std::optional<std::string> receive(std::chrono::milliseconds timeout) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    zmq::message_t reply;
    if (!socket_.recv(reply, zmq::recv_flags::dontwait)) return std::nullopt;
    return reply.to_string();
  }
  // Says hello as `node`; the collector's answer (accepted, reason), or nothing within `timeout`.
  std::optional<std::pair<bool, std::string>> hello(const std::string& node, std::chrono::milliseconds timeout) {
    send(testing::hello_message(node, 42));
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      auto bytes = receive(std::chrono::milliseconds(100));
      if (!bytes) continue;
      std::optional<std::pair<bool, std::string>> answer;
      auto read = proto::read_packed<wire::CollectorMessage>(*bytes, proto::ReadLimits{}, [&](auto m) {
        if (m.which() != wire::CollectorMessage::HELLO_REPLY) return;
        answer = std::make_pair(m.getHelloReply().getAccepted(), std::string(m.getHelloReply().getReason().cStr()));
        clock_port = m.getHelloReply().getClockPort();
      });
      EXPECT_TRUE(read);
      if (answer) return answer;
    }
    return std::nullopt;
  }
  uint16_t clock_port = 0;  // as the last HelloReply said

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

curve::ClientKeys agent_keys(TestKeys& keys, const std::string& node, bool admitted) {
  auto args = keys.agent_args(node, admitted);  // --key K --collector-key C
  auto loaded = curve::load_client_keys(args[1], args[3]);
  EXPECT_TRUE(loaded);
  return loaded ? *loaded : curve::ClientKeys{};
}

constexpr auto kRefusedWindow = std::chrono::seconds(3);

TEST(Auth, AdmittedAgentIsAcceptedUnderItsOwnName) {
  TempDir dir;
  TestKeys keys(dir);
  auto node_keys = agent_keys(keys, "node-1", true);
  Collector collector(dir, &keys);
  ASSERT_TRUE(collector.up) << slurp(collector.log);
  RawAgent agent(collector.agent_port, node_keys);
  auto answer = agent.hello("node-1", std::chrono::seconds(10));
  ASSERT_TRUE(answer) << slurp(collector.log);
  EXPECT_TRUE(answer->first) << answer->second;
}

TEST(Auth, AgentWithUnknownKeyIsRefused) {
  TempDir dir;
  TestKeys keys(dir);
  int metrics_port = free_port();
  Collector collector(dir, &keys, {"--metrics", "127.0.0.1:" + std::to_string(metrics_port)});
  ASSERT_TRUE(collector.up) << slurp(collector.log);
  RawAgent stranger(collector.agent_port, agent_keys(keys, "node-9", false));
  EXPECT_FALSE(stranger.hello("node-9", kRefusedWindow)) << "an unknown key gets no answer at all";
  cli::QueryClient client(endpoint(collector.query_port), 2000, keys.client());
  auto status = Collector::status(client);
  ASSERT_TRUE(status);
  EXPECT_EQ(status->nodes.count("node-9"), 0u);
  EXPECT_TRUE(wait_for([&] { return slurp(collector.log).find("not in the allow-list") != std::string::npos; },
                       std::chrono::seconds(5)))
      << slurp(collector.log);
  // Counted for the operator: the refusal, and the admitted query client.
  EXPECT_TRUE(
      wait_for([&] { return collector_metric(metrics_port, "rankscope_handshakes_total{result=\"refused\"}") >= 1; },
               std::chrono::seconds(10)))
      << slurp(collector.log);
  EXPECT_GE(collector_metric(metrics_port, "rankscope_handshakes_total{result=\"admitted\"}"), 1);
}

TEST(Auth, AgentSpeakingForAnotherNodeIsRefused) {
  TempDir dir;
  TestKeys keys(dir);
  keys.agent_args("node-0");  // node-0 is admitted too: its name is taken only with its key
  // Keys are in the allow-list before the collector starts: libzmq does not
  // retry a refused handshake (the real agent reconnects by itself).
  auto node_keys = agent_keys(keys, "node-1", true);
  Collector collector(dir, &keys);
  ASSERT_TRUE(collector.up) << slurp(collector.log);
  RawAgent agent(collector.agent_port, node_keys);
  auto answer = agent.hello("node-0", std::chrono::seconds(10));
  ASSERT_TRUE(answer) << slurp(collector.log);
  EXPECT_FALSE(answer->first);
  EXPECT_NE(answer->second.find("bound to node node-1, not node-0"), std::string::npos) << answer->second;
  cli::QueryClient client(endpoint(collector.query_port), 2000, keys.client());
  auto status = Collector::status(client);
  ASSERT_TRUE(status);
  EXPECT_EQ(status->nodes.count("node-0"), 0u) << "node-0 was never spoken for";
  EXPECT_GE(status->bad, 1u);
  EXPECT_NE(slurp(collector.log).find("the key of node node-1 used to speak for node node-0"), std::string::npos)
      << slurp(collector.log);
  // The same connection may still say who it really is.
  auto own = agent.hello("node-1", std::chrono::seconds(5));
  ASSERT_TRUE(own);
  EXPECT_TRUE(own->first) << own->second;
}

TEST(Auth, PlaintextAgentIsRefusedAndTheRealAgentSaysWhy) {
  if (geteuid() != 0) GTEST_SKIP() << "the real agent loads eBPF programs: run the suite as root (sudo make test)";
  TempDir dir;
  TestKeys keys(dir);
  Collector collector(dir, &keys);
  ASSERT_TRUE(collector.up) << slurp(collector.log);
  RawAgent plain(collector.agent_port, curve::ClientKeys{});
  EXPECT_FALSE(plain.hello("node-1", kRefusedWindow)) << "a plaintext hello gets no answer";

  SpawnOptions spawn;
  spawn.argv = {bin_path("rankscope-agent"), "--collector", endpoint(collector.agent_port), "--node", "node-1",
                "--pid", std::to_string(getpid()), "--insecure", "--host-context", "false"};
  spawn.stdout_path = dir.file("agent.log");
  Process agent(spawn);
  EXPECT_TRUE(wait_for([&] { return slurp(dir.file("agent.log")).find("no reply from collector") != std::string::npos; },
                       std::chrono::seconds(40)))
      << slurp(dir.file("agent.log"));
  EXPECT_NE(slurp(dir.file("agent.log")).find("a collector with CurveZMQ never answers a plaintext agent"),
            std::string::npos);
  cli::QueryClient client(endpoint(collector.query_port), 2000, keys.client());
  auto status = Collector::status(client);
  ASSERT_TRUE(status);
  EXPECT_TRUE(status->nodes.empty());
}

TEST(Auth, AgentKeyAdmittedLaterIsTakenWithoutRestart) {
  if (geteuid() != 0) GTEST_SKIP() << "the real agent loads eBPF programs: run the suite as root (sudo make test)";
  TempDir dir;
  TestKeys keys(dir);
  auto flags = keys.agent_args("node-1", false);
  Collector collector(dir, &keys);
  ASSERT_TRUE(collector.up) << slurp(collector.log);
  SpawnOptions spawn;
  spawn.argv = {bin_path("rankscope-agent"), "--collector", endpoint(collector.agent_port), "--node", "node-1",
                "--pid", std::to_string(getpid()), "--host-context", "false"};
  spawn.argv.insert(spawn.argv.end(), flags.begin(), flags.end());
  spawn.stdout_path = dir.file("agent.log");
  Process agent(spawn);
  ASSERT_TRUE(wait_for([&] { return slurp(dir.file("agent.log")).find("no reply from collector") != std::string::npos; },
                       std::chrono::seconds(40)))
      << slurp(dir.file("agent.log"));
  EXPECT_NE(slurp(dir.file("agent.log")).find("in its allow-list (bound to node node-1)"), std::string::npos)
      << slurp(dir.file("agent.log"));
  // The operator adds its key: the agent gets in on its next attempt.
  std::filesystem::copy_file(dir.file("keys/agent-node-1.pub"), keys.allow_dir() + "/agent-node-1.pub");
  cli::QueryClient client(endpoint(collector.query_port), 2000, keys.client());
  EXPECT_TRUE(wait_for(
      [&] {
        auto status = Collector::status(client);
        return status && status->nodes.count("node-1");
      },
      std::chrono::seconds(30)))
      << slurp(dir.file("agent.log")) << slurp(collector.log);
}

TEST(Auth, QuerySocketAdmitsOnlyAllowedClients) {
  TempDir dir;
  TestKeys keys(dir);
  auto node_keys = agent_keys(keys, "node-1", true);
  Collector collector(dir, &keys);
  ASSERT_TRUE(collector.up) << slurp(collector.log);
  cli::QueryClient allowed(endpoint(collector.query_port), 2000, keys.client());
  EXPECT_TRUE(Collector::status(allowed));
  cli::QueryClient plain(endpoint(collector.query_port), 1500);
  EXPECT_FALSE(Collector::status(plain)) << "plaintext client answered by a CurveZMQ collector";
  cli::QueryClient stranger(endpoint(collector.query_port), 1500, keys.unknown_client());
  EXPECT_FALSE(Collector::status(stranger)) << "unknown client key answered";
  cli::QueryClient agent_key(endpoint(collector.query_port), 1500, node_keys);
  EXPECT_FALSE(Collector::status(agent_key)) << "an agent's key is not a client's";

  // The CLI binary: refused in plaintext, with a message that says why; served with its key.
  std::string flags = " --collector " + endpoint(collector.query_port) + " --timeout-ms 1500";
  std::string out = dir.file("cli.out");
  EXPECT_NE(run_command(bin_path("rankscope") + " status --insecure" + flags + " >" + out + " 2>&1"), 0);
  EXPECT_NE(slurp(out).find("a collector with CurveZMQ never answers a plaintext client"), std::string::npos)
      << slurp(out);
  std::string key_flags;
  for (const auto& arg : keys.cli_args()) key_flags += " " + arg;
  EXPECT_EQ(run_command(bin_path("rankscope") + " status" + flags + key_flags + " >" + out + " 2>&1"), 0) << slurp(out);
  EXPECT_NE(slurp(out).find("collector 0.1.0"), std::string::npos) << slurp(out);
}

TEST(Auth, RevokedKeyIsRefusedOnItsNextConnection) {
  TempDir dir;
  TestKeys keys(dir);
  auto node_keys = agent_keys(keys, "node-1", true);
  Collector collector(dir, &keys);
  ASSERT_TRUE(collector.up) << slurp(collector.log);
  {
    RawAgent agent(collector.agent_port, node_keys);
    auto answer = agent.hello("node-1", std::chrono::seconds(10));
    ASSERT_TRUE(answer && answer->first);
  }
  std::filesystem::remove(keys.allow_dir() + "/agent-node-1.pub");
  EXPECT_TRUE(wait_for(
      [&] {
        RawAgent again(collector.agent_port, node_keys);
        return !again.hello("node-1", std::chrono::seconds(2));
      },
      std::chrono::seconds(15)))
      << slurp(collector.log);
  EXPECT_NE(slurp(collector.log).find("(reloaded)"), std::string::npos) << slurp(collector.log);
}

TEST(Auth, InsecureCollectorTakesPlaintextAndSaysSoLoudly) {
  TempDir dir;
  Collector collector(dir, nullptr);
  ASSERT_TRUE(collector.up) << slurp(collector.log);
  RawAgent plain(collector.agent_port, curve::ClientKeys{});
  auto answer = plain.hello("node-1", std::chrono::seconds(10));
  ASSERT_TRUE(answer);
  EXPECT_TRUE(answer->first) << answer->second;
  cli::QueryClient client(endpoint(collector.query_port), 2000);
  EXPECT_TRUE(Collector::status(client));
  EXPECT_NE(slurp(collector.log).find("--insecure: plaintext and NO authentication"), std::string::npos)
      << slurp(collector.log);
}

std::string heartbeat() {
  capnp::MallocMessageBuilder message;
  auto hb = message.initRoot<wire::AgentMessage>().initHeartbeat();
  hb.setInstanceId(42);
  return proto::to_packed(message);
}

std::string clock_probe(uint64_t t1) {
  capnp::MallocMessageBuilder message;
  message.initRoot<wire::AgentMessage>().initClockProbe().setT1(t1);
  return proto::to_packed(message);
}

// A peer sending far over its budget is throttled; the peer beside it gets
// every answer, promptly, the whole time.
TEST(RateLimit, FloodingPeerIsThrottledAndTheOtherIsServed) {
  TempDir dir;
  TestKeys keys(dir);
  auto flood_keys = agent_keys(keys, "flood", true), calm_keys = agent_keys(keys, "calm", true);
  int metrics_port = free_port();
  Collector collector(dir, &keys, {"--max-messages-per-s", "200", "--metrics", "127.0.0.1:" + std::to_string(metrics_port)});
  ASSERT_TRUE(collector.up) << slurp(collector.log);
  RawAgent flood(collector.agent_port, flood_keys);
  RawAgent calm(collector.agent_port, calm_keys);
  ASSERT_TRUE(flood.hello("flood", std::chrono::seconds(10)));
  ASSERT_TRUE(calm.hello("calm", std::chrono::seconds(10)));

  std::string beat = heartbeat();
  int answered = 0, asked = 0;
  auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(3)) {
    for (int i = 0; i < 2000; ++i) flood.send(beat);
    // The calm peer: one clock probe at a time, 10 a second, each answered.
    if (asked == answered) {
      calm.send(clock_probe(++asked));
    }
    if (auto reply = calm.receive(std::chrono::milliseconds(0))) ++answered;
    while (flood.receive(std::chrono::milliseconds(0))) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // What is still in flight.
  if (answered < asked && calm.receive(std::chrono::seconds(5))) ++answered;
  EXPECT_EQ(answered, asked) << "the calm peer lost answers while the other flooded";
  EXPECT_GE(asked, 20);

  cli::QueryClient client(endpoint(collector.query_port), 3000, keys.client());
  std::optional<Collector::Status> status;
  ASSERT_TRUE(wait_for(
      [&] {
        status = Collector::status(client);
        return status && status->nodes["flood"].second > 0;
      },
      std::chrono::seconds(10)));
  EXPECT_GT(status->nodes["flood"].second, 1000u) << "about 800 allowed in 3 s (200 a second and a burst of 200)";
  EXPECT_EQ(status->nodes["calm"].second, 0u);
  EXPECT_EQ(status->throttled, status->nodes["flood"].second);
  std::string log = slurp(collector.log);
  EXPECT_NE(log.find("bad message from node flood: over the rate limit"), std::string::npos) << log;
  // Logged rate-limited: a line per 10 s, not one per message.
  size_t lines = 0;
  for (size_t at = log.find("over the rate limit"); at != std::string::npos; at = log.find("over the rate limit", at + 1))
    ++lines;
  EXPECT_LE(lines, 3u);
  // And in the metrics, as the status counts them.
  EXPECT_TRUE(wait_for(
      [&] {
        status = Collector::status(client);
        return status && collector_metric(metrics_port, "rankscope_throttled_messages_total{socket=\"agent\"}") ==
                             static_cast<double>(status->throttled);
      },
      std::chrono::seconds(10)))
      << collector_metric(metrics_port, "rankscope_throttled_messages_total{socket=\"agent\"}");
  EXPECT_EQ(collector_metric(metrics_port, "rankscope_throttled_messages_total{socket=\"query\"}"), 0);
}

// Clock probes have a socket and a thread of their own: the HelloReply
// names its port; an admitted key's probe is answered there (its t1 back,
// t2 <= t3 on the collector's clock), an unknown key gets nothing (refused
// at the handshake), a key past 20 probes a second is cut to its budget,
// and what is not a probe is dropped. The metrics count each.
TEST(ClockSocket, AnswersAdmittedKeysWithinTheirBudgetAndNobodyElse) {
  TempDir dir;
  TestKeys keys(dir);
  auto gpu1_keys = agent_keys(keys, "gpu-1", true), stranger_keys = agent_keys(keys, "gpu-9", false);
  int metrics_port = free_port();
  Collector collector(dir, &keys, {"--metrics", "127.0.0.1:" + std::to_string(metrics_port)});
  ASSERT_TRUE(collector.up) << slurp(collector.log);
  RawAgent agent(collector.agent_port, gpu1_keys);
  ASSERT_TRUE(agent.hello("gpu-1", std::chrono::seconds(10)));
  ASSERT_NE(agent.clock_port, 0) << "the HelloReply names the clock port";
  EXPECT_NE(agent.clock_port, collector.agent_port);

  auto read_reply = [](const std::string& bytes) {
    std::optional<std::array<uint64_t, 3>> times;
    EXPECT_TRUE(proto::read_packed<wire::CollectorMessage>(bytes, proto::ReadLimits{}, [&](auto m) {
      if (m.which() == wire::CollectorMessage::CLOCK_REPLY)
        times = {m.getClockReply().getT1(), m.getClockReply().getT2(), m.getClockReply().getT3()};
    }));
    return times;
  };
  RawAgent prober(agent.clock_port, gpu1_keys);
  const uint64_t before = SystemClock().realtime_ns();
  prober.send(clock_probe(1234));
  auto reply = prober.receive(std::chrono::seconds(10));
  const uint64_t after = SystemClock().realtime_ns();
  ASSERT_TRUE(reply) << slurp(collector.log);
  auto times = read_reply(*reply);
  ASSERT_TRUE(times) << "a clock reply";
  EXPECT_EQ((*times)[0], 1234u);
  EXPECT_LE(before, (*times)[1]);
  EXPECT_LE((*times)[1], (*times)[2]);
  EXPECT_LE((*times)[2], after);

  RawAgent stranger(agent.clock_port, stranger_keys);
  stranger.send(clock_probe(1));
  EXPECT_FALSE(stranger.receive(std::chrono::seconds(2))) << "a key not on the allow-list is not answered";

  // 60 probes at once: a full burst of 20 (refilled while the stranger
  // waited), and what refills while they are read.
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < 60; ++i) prober.send(clock_probe(2000 + i));
  prober.send(heartbeat());  // not a probe: dropped
  int answered = 0;
  while (auto r = prober.receive(std::chrono::milliseconds(500))) answered += read_reply(*r).has_value();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(answered, 20);
  EXPECT_LE(answered, 20 + static_cast<int>(20 * seconds) + 1) << "in " << seconds << " s";
  const double dropped = 60 - answered + 1;
  EXPECT_TRUE(wait_for(
      [&] {
        return collector_metric(metrics_port, "rankscope_clock_probes_total{result=\"answered\",socket=\"clock\"}") ==
                   1 + answered &&
               collector_metric(metrics_port, "rankscope_clock_probes_total{result=\"dropped\",socket=\"clock\"}") ==
                   dropped;
      },
      std::chrono::seconds(10)))
      << collector_metric(metrics_port, "rankscope_clock_probes_total{result=\"answered\",socket=\"clock\"}") << " "
      << collector_metric(metrics_port, "rankscope_clock_probes_total{result=\"dropped\",socket=\"clock\"}");
}

// A peer with no key at all, speaking ZMTP 3.0 over plain TCP: its greeting
// asks for the CURVE handshake, and its first frame claims `claimed` bytes.
// True if the collector closed the connection within `within` of the frame's
// header (it refuses the length before it allocates the frame); false if it
// kept waiting for the bytes.
bool closed_at_the_header(int port, uint64_t claimed, std::chrono::milliseconds within) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return false;
  }
  std::string greeting(64, '\0');
  greeting[0] = '\xff';
  greeting[9] = '\x7f';
  greeting[10] = 3;  // ZMTP 3.0
  greeting.replace(12, 5, "CURVE");
  // A long command frame (flags: command, long) of `claimed` bytes, then a few of them.
  std::string frame(1, '\x06');
  for (int shift = 56; shift >= 0; shift -= 8) frame += static_cast<char>((claimed >> shift) & 0xff);
  frame += std::string(64, 'x');
  bool sent = ::send(fd, greeting.data(), greeting.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(greeting.size()) &&
              ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size());
  bool closed = false;
  auto deadline = std::chrono::steady_clock::now() + within;
  while (sent && !closed && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buffer[256];
    ssize_t n = recv(fd, buffer, sizeof(buffer), 0);  // the collector's greeting, then the end
    closed = n == 0 || (n < 0 && errno == ECONNRESET);
  }
  close(fd);
  return closed;
}

// A peer without a key claims a frame larger than the socket reads
// (ZMQ_MAXMSGSIZE: 16 MiB on the agent port, 64 KiB on the query port)
// before any handshake: the collector drops the connection at the frame's
// header instead of buffering it, and serves everyone else. One just under
// the limit is kept waiting for its bytes, as any frame is.
TEST(FrameLimit, AFrameOverTheSocketsLimitIsRefusedAtItsHeader) {
  TempDir dir;
  TestKeys keys(dir);
  Collector collector(dir, &keys);
  ASSERT_TRUE(collector.up) << slurp(collector.log);
  EXPECT_TRUE(closed_at_the_header(collector.agent_port, (16ull << 20) + 1, std::chrono::seconds(3)))
      << "the agent port waits for a frame over 16 MiB";
  EXPECT_TRUE(closed_at_the_header(collector.agent_port, 1ull << 40, std::chrono::seconds(3)));
  EXPECT_TRUE(closed_at_the_header(collector.query_port, (64ull << 10) + 1, std::chrono::seconds(3)))
      << "the query port waits for a frame over 64 KiB";
  EXPECT_FALSE(closed_at_the_header(collector.query_port, 60ull << 10, std::chrono::milliseconds(1500)))
      << "a frame within the limit was refused at its header: the test no longer tells the limit apart";
  // Still up, and still serving.
  cli::QueryClient client(endpoint(collector.query_port), 3000, keys.client());
  EXPECT_TRUE(Collector::status(client).has_value()) << slurp(collector.log);
  EXPECT_TRUE(collector.process->running());
}

}  // namespace
}  // namespace rankscope::testing
