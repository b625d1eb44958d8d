// gloocheck: Gloo's ibverbs transport between ranks on separate hosts.
//
//   gloocheck -r RANK -s SIZE -f STOREDIR -d DEVICE (-a IPV4 | -g GIDINDEX)
//             [-p PORT] [-n COUNT] [-i RUNS] [-t SECONDS]
//
// The ranks meet through Gloo's FileStore in STOREDIR, a directory every
// rank can write (Gloo 0.5 has file, hash (in-process) and Redis stores,
// no TCP store of its own). Each rank opens DEVICE through
// gloo::transport::ibverbs::CreateDevice, on PORT (1) and the GID index
// given by -g or, with -a, the index whose GID is IPV4's IPv4-mapped
// address (0 on softroce, whose port has one GID; 1 on kernel rxe, whose
// GID 0 is the link-local IPv6 address).
//
// Then, RUNS times each: AllreduceRing (sum) of COUNT floats and
// BroadcastOneToAll of COUNT floats from rank 0, every element checked
// against its exact value (inputs are small integers plus quarters, so
// every sum is exact in a float). Gloo's ibverbs transport has no unbound
// buffers, so the options-based gloo::allreduce and gloo::broadcast are
// not available on it: these are its algorithm classes.
//
// Prints one line per operation, "allreduce N floats ok in X ms (...)"
// and "broadcast N floats ok in X ms (...)", and "gloocheck: ok" at the
// end; exits 1 on a wrong element, 2 on any other error.

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "gloo/allreduce_ring.h"
#include "gloo/barrier_all_to_all.h"
#include "gloo/broadcast_one_to_all.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/ibverbs/device.h"

namespace {

[[noreturn]] void usage() {
  fprintf(stderr,
          "usage: gloocheck -r RANK -s SIZE -f STOREDIR -d DEVICE (-a IPV4 | -g GIDINDEX)"
          " [-p PORT] [-n COUNT] [-i RUNS] [-t SECONDS]\n");
  exit(2);
}

// gidIndexOf is the index of DEVICE's PORT whose GID is addr's IPv4-mapped
// address (::ffff:a.b.c.d), or -1.
int gidIndexOf(const std::string& device, int port, const in_addr& addr) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) {
    perror("ibv_get_device_list");
    return -1;
  }
  int found = -1;
  for (int i = 0; i < n && found < 0; i++) {
    if (device != ibv_get_device_name(list[i])) {
      continue;
    }
    ibv_context* ctx = ibv_open_device(list[i]);
    if (ctx == nullptr) {
      perror("ibv_open_device");
      break;
    }
    ibv_port_attr pa;
    if (ibv_query_port(ctx, port, &pa) != 0) {
      perror("ibv_query_port");
    } else {
      unsigned char want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
      memcpy(want + 12, &addr, 4);
      for (int g = 0; g < pa.gid_tbl_len; g++) {
        ibv_gid gid;
        if (ibv_query_gid(ctx, port, g, &gid) == 0 && memcmp(gid.raw, want, 16) == 0) {
          found = g;
          break;
        }
      }
    }
    ibv_close_device(ctx);
    break;
  }
  ibv_free_device_list(list);
  return found;
}

double ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// allreduceInput is rank r's element i: a small integer plus (r+1)/4.
float allreduceInput(int r, size_t i) {
  return float((i * 7 + size_t(r) * 13) % 65536) + 0.25f * float(r + 1);
}

// broadcastValue is the root's element i.
float broadcastValue(size_t i) {
  return float((i * 31 + 5) % 1000003);
}

// check compares got with want, printing the first few wrong elements;
// it returns the number of wrong ones.
size_t check(const char* op, int run, const std::vector<float>& got,
             const std::vector<float>& want) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); i++) {
    // Bitwise, so that a NaN never passes.
    if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      if (bad < 5) {
        fprintf(stderr, "%s run %d: element %zu is %.9g, want %.9g\n", op, run, i, got[i], want[i]);
      }
      bad++;
    }
  }
  if (bad > 0) {
    fprintf(stderr, "%s run %d: %zu of %zu elements wrong\n", op, run, bad, got.size());
  }
  return bad;
}

void summary(const char* op, size_t count, const std::vector<double>& times) {
  double sum = 0, best = times[0];
  for (double t : times) {
    sum += t;
    if (t < best) {
      best = t;
    }
  }
  double mean = sum / double(times.size());
  printf("%s %zu floats ok in %.1f ms (mean of %zu runs; best %.1f ms, %.1f MB/s)\n", op, count,
         mean, times.size(), best, double(count * sizeof(float)) / (best * 1e3));
  fflush(stdout);
}

int run(int argc, char** argv) {
  int rank = -1, size = -1, port = 1, gidIndex = -1, runs = 3, timeoutSec = 60;
  size_t count = 1 << 20;
  std::string store, device, addr;
  int c;
  while ((c = getopt(argc, argv, "r:s:f:d:a:g:p:n:i:t:")) != -1) {
    switch (c) {
      case 'r': rank = atoi(optarg); break;
      case 's': size = atoi(optarg); break;
      case 'f': store = optarg; break;
      case 'd': device = optarg; break;
      case 'a': addr = optarg; break;
      case 'g': gidIndex = atoi(optarg); break;
      case 'p': port = atoi(optarg); break;
      case 'n': count = strtoull(optarg, nullptr, 0); break;
      case 'i': runs = atoi(optarg); break;
      case 't': timeoutSec = atoi(optarg); break;
      default: usage();
    }
  }
  if (optind != argc || rank < 0 || size < 1 || rank >= size || store.empty() || device.empty() ||
      (addr.empty() == (gidIndex < 0)) || count == 0 || runs < 1 || timeoutSec < 1) {
    usage();
  }

  std::string names;
  bool listed = false;
  for (const auto& n : gloo::transport::ibverbs::getDeviceNames()) {
    names += (names.empty() ? "" : " ") + n;
    listed = listed || n == device;
  }
  printf("rank %d devices: %s\n", rank, names.empty() ? "(none)" : names.c_str());
  if (!listed) {
    fprintf(stderr, "gloocheck: no ibverbs device %s\n", device.c_str());
    return 2;
  }
  if (!addr.empty()) {
    in_addr a;
    if (inet_pton(AF_INET, addr.c_str(), &a) != 1) {
      fprintf(stderr, "gloocheck: -a %s is not an IPv4 address\n", addr.c_str());
      return 2;
    }
    gidIndex = gidIndexOf(device, port, a);
    if (gidIndex < 0) {
      fprintf(stderr, "gloocheck: %s port %d has no GID ::ffff:%s\n", device.c_str(), port,
              addr.c_str());
      return 2;
    }
  }

  gloo::transport::ibverbs::attr attr;
  attr.name = device;
  attr.port = port;
  attr.index = gidIndex;
  auto dev = gloo::transport::ibverbs::CreateDevice(attr);
  printf("rank %d of %d: %s\n", rank, size, dev->str().c_str());

  auto timeout = std::chrono::seconds(timeoutSec);
  gloo::rendezvous::FileStore fs(store);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(timeout);
  auto t0 = std::chrono::steady_clock::now();
  ctx->connectFullMesh(fs, dev);
  printf("rank %d connected in %.1f ms\n", rank, ms(std::chrono::steady_clock::now() - t0));
  fflush(stdout);

  gloo::BarrierAllToAll barrier(ctx);
  size_t bad = 0;

  // Allreduce (sum), in place.
  std::vector<float> data(count), want(count);
  for (size_t i = 0; i < count; i++) {
    double s = 0;
    for (int r = 0; r < size; r++) {
      s += allreduceInput(r, i);
    }
    want[i] = float(s);
  }
  std::vector<float*> ptrs{data.data()};
  gloo::AllreduceRing<float> allreduce(ctx, ptrs, int(count));
  std::vector<double> times;
  for (int i = 0; i < runs; i++) {
    for (size_t j = 0; j < count; j++) {
      data[j] = allreduceInput(rank, j);
    }
    barrier.run();
    auto start = std::chrono::steady_clock::now();
    allreduce.run();
    times.push_back(ms(std::chrono::steady_clock::now() - start));
    bad += check("allreduce", i, data, want);
  }
  if (bad == 0) {
    summary("allreduce", count, times);
  }

  // Broadcast from rank 0.
  std::vector<float> bdata(count), bwant(count);
  for (size_t i = 0; i < count; i++) {
    bwant[i] = broadcastValue(i);
  }
  std::vector<float*> bptrs{bdata.data()};
  gloo::BroadcastOneToAll<float> broadcast(ctx, bptrs, count, 0);
  times.clear();
  size_t bbad = 0;
  for (int i = 0; i < runs; i++) {
    if (rank == 0) {
      bdata = bwant;
    } else {
      std::fill(bdata.begin(), bdata.end(), NAN);
    }
    barrier.run();
    auto start = std::chrono::steady_clock::now();
    broadcast.run();
    times.push_back(ms(std::chrono::steady_clock::now() - start));
    bbad += check("broadcast", i, bdata, bwant);
  }
  if (bbad == 0) {
    summary("broadcast", count, times);
  }
  bad += bbad;

  // Neither rank leaves while the other may still use the pairs.
  barrier.run();
  if (bad != 0) {
    printf("gloocheck: %zu wrong elements\n", bad);
    return 1;
  }
  printf("gloocheck: ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fprintf(stderr, "gloocheck: %s\n", e.what());
    return 2;
  }
}
