#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <time.h>
#include <errno.h>
static size_t RESP;
static long now_ns(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000L+t.tv_nsec;}
static void* srv(void*a){int fd=*(int*)a;char req[64];char*resp=malloc(RESP);memset(resp,1,RESP);
 for(;;){ssize_t n=recv(fd,req,64,MSG_WAITALL);if(n<=0)return 0;size_t off=0;while(off<RESP){ssize_t m=send(fd,resp+off,RESP-off,0);if(m<=0)return 0;off+=m;}}}
static int cmp(const void*a,const void*b){long x=*(long*)a,y=*(long*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){int tcp=atoi(argv[1]);int spin=atoi(argv[2]);RESP=atol(argv[3]);int N=20000;
 int sv[2];
 if(!tcp){socketpair(AF_UNIX,SOCK_STREAM,0,sv);}else{int l=socket(AF_INET,SOCK_STREAM,0);struct sockaddr_in a={0};a.sin_family=AF_INET;a.sin_addr.s_addr=htonl(0x7f000001);bind(l,(void*)&a,sizeof a);socklen_t sl=sizeof a;getsockname(l,(void*)&a,&sl);listen(l,1);sv[0]=socket(AF_INET,SOCK_STREAM,0);connect(sv[0],(void*)&a,sizeof a);sv[1]=accept(l,0,0);int one=1;setsockopt(sv[0],IPPROTO_TCP,TCP_NODELAY,&one,4);setsockopt(sv[1],IPPROTO_TCP,TCP_NODELAY,&one,4);}
 pthread_t t;pthread_create(&t,0,srv,&sv[1]);
 char req[64]={0};char*buf=malloc(RESP);long*lat=malloc(N*sizeof(long));
 for(int i=0;i<N;i++){long s=now_ns();send(sv[0],req,64,0);size_t got=0;
  while(got<RESP){ssize_t n;
   if(spin){long st=now_ns();do{n=recv(sv[0],buf+got,RESP-got,MSG_DONTWAIT);}while(n<0&&errno==EAGAIN&&now_ns()-st<spin*1000L);
     if(n<0&&errno==EAGAIN)n=recv(sv[0],buf+got,RESP-got,0);}
   else n=recv(sv[0],buf+got,RESP-got,0);
   if(n<=0){perror("recv");return 1;}got+=n;}
  lat[i]=now_ns()-s;}
 qsort(lat,N,sizeof(long),cmp);printf("tcp=%d spin=%dus resp=%zu p50=%.1fus p90=%.1fus\n",tcp,spin,RESP,lat[N/2]/1e3,lat[N*9/10]/1e3);return 0;}
